"""Tracing across processes' parts on a real cluster (a broker and a coordinator on memory
and on etcd): one transaction is one trace from the client through the coordinator to the
broker, materialization spans link to its END_TXN, frames without a trace context work as
before, log lines under a span carry its ids, and with tracing off nothing is made."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import aiohttp
import msgspec
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanContext, SpanKind

from segtxn import tracing
from segtxn.cli.logs import JsonFormatter, TextFormatter
from segtxn.cli.verbosity import FORMAT
from segtxn.client import Client, InvalidTxnStatus
from segtxn.protocol import frames
from segtxn.protocol.frames import ProducerReady, Receipt, Send
from tests.cluster import Cluster
from tests.waiting import wait_until
from tests.wsframes import next_frame

IN = "topic://acme/traced/orders"
OUT = "topic://acme/traced/invoices"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on, into memory, for this test (this process: client and servers alike)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    try:
        yield exporter
    finally:
        tracing.disable()
        provider.shutdown()


def made(exporter: InMemorySpanExporter, scope: str, prefix: str) -> list[ReadableSpan]:
    return [
        s
        for s in exporter.get_finished_spans()
        if s.instrumentation_scope is not None
        and s.instrumentation_scope.name == scope
        and s.name.startswith(prefix)
    ]


def only(found: list[ReadableSpan]) -> ReadableSpan:
    assert len(found) == 1, [s.name for s in found]
    return found[0]


def parent_of(span: ReadableSpan) -> int:
    assert span.parent is not None, f"{span.name} has no parent"
    return span.parent.span_id


def context_of(span: ReadableSpan) -> SpanContext:
    context: SpanContext | None = span.context  # the SDK leaves the property unannotated
    assert context is not None
    return context


def span_id(span: ReadableSpan) -> int:
    return context_of(span).span_id


def trace_of(span: ReadableSpan) -> int:
    return context_of(span).trace_id


async def test_a_transaction_is_one_trace_from_client_to_coordinator_and_broker(
    cluster: Cluster, spans: InMemorySpanExporter
) -> None:
    """END_TXN at the coordinator: the one-step commit (a commit at the broker, when all
    went to one broker as here) is off for this trace."""
    async with Client(cluster.url, one_step_commit=False) as client:
        await one_trace(client, spans)


async def one_trace(client: Client, spans: InMemorySpanExporter) -> None:
    await client.admin.create_topic(IN, segments=1)
    await client.admin.create_topic(OUT, segments=2)
    orders = await client.subscribe(IN, "billing", initial_position="earliest")
    await (await client.create_producer(IN)).send(b"order", key="o")
    order = await orders.receive(timeout_s=10)
    invoices = await client.create_producer(OUT)
    async with client.transaction() as txn:
        ids = [await invoices.send(b"i%d" % i, key=f"k{i}", txn=txn) for i in range(8)]
        await orders.acknowledge(order, txn=txn)
    segments = {i.topic for i in ids}
    assert len(segments) == 2  # sends to both segments of OUT, on the one broker

    def materialized() -> list[ReadableSpan]:
        return made(spans, tracing.BROKER, "materialize")

    # writes on both segments of OUT, the ack on IN's segment: applied as the broker's
    # header watch sees the commit
    await wait_until(lambda: len(materialized()) == 3, what="three materialization spans")

    root = only(made(spans, tracing.CLIENT, "transaction"))
    assert root.parent is None
    assert root.attributes is not None and root.attributes["segtxn.txn.outcome"] == "COMMITTED"
    assert root.attributes["segtxn.txn.id"] == str(txn.id)
    trace_id = trace_of(root)
    in_trace = [s for s in spans.get_finished_spans() if trace_of(s) == trace_id]

    def of(scope: str, prefix: str) -> list[ReadableSpan]:
        return [s for s in made(spans, scope, prefix) if s in in_trace]

    # NEW_TXN and END_TXN: client span under the transaction, coordinator span under it
    for name in ("new-txn", "end-txn"):
        asked = only(of(tracing.CLIENT, name))
        served = only(of(tracing.COORDINATOR, name))
        assert asked.kind is SpanKind.CLIENT and served.kind is SpanKind.SERVER
        assert parent_of(asked) == span_id(root)
        assert parent_of(served) == span_id(asked)
        assert served.attributes is not None
        assert served.attributes["segtxn.txn.id"] == str(txn.id)
    end_txn = only(of(tracing.COORDINATOR, "end-txn"))

    # each send: a client span under the transaction, the broker's under it, on its segment
    def seq(span: ReadableSpan) -> tuple[str, object]:  # one producer per segment
        assert span.attributes is not None
        return span.name, span.attributes["segtxn.seq"]

    sent = {seq(s): s for s in of(tracing.CLIENT, "send ")}
    stored = of(tracing.BROKER, "send ")
    assert len(sent) == len(stored) == 8
    assert {s.name for s in stored} == {f"send {segment}" for segment in segments}
    for span in sent.values():
        assert span.kind is SpanKind.PRODUCER and parent_of(span) == span_id(root)
    for span in stored:
        asked = sent[seq(span)]  # the same segment and seq
        assert parent_of(span) == span_id(asked)
        assert span.attributes is not None and asked.attributes is not None
        assert span.attributes["messaging.message.id"] == asked.attributes["messaging.message.id"]

    # the ack: client span under the transaction, the broker's under it
    acked = only(of(tracing.CLIENT, "ack "))
    recorded = only(of(tracing.BROKER, "ack "))
    assert parent_of(acked) == span_id(root) and parent_of(recorded) == span_id(acked)
    assert recorded.attributes is not None
    assert recorded.attributes["messaging.destination.subscription.name"] == "billing"

    # materialization: traces of their own, each linked to the coordinator's END_TXN span
    for span in materialized():
        assert span.parent is None and trace_of(span) != trace_id
        assert [(link.context.trace_id, link.context.span_id) for link in span.links] == [
            (trace_id, span_id(end_txn))
        ]
        assert span.attributes is not None
        assert span.attributes["segtxn.txn.outcome"] == "COMMITTED"
    assert sorted(s.name for s in materialized()) == sorted(
        [f"materialize writes {segment}" for segment in segments]
        + [f"materialize acks {order.message_id.topic}"]
    )


async def test_frames_without_a_trace_context_are_served_as_before(
    cluster: Cluster, spans: InMemorySpanExporter
) -> None:
    """An older client's send (no field at all), a malformed context and a good one: all
    stored; only the good one gets a broker span, under the span it names."""
    async with Client(cluster.url) as client:
        await client.admin.create_topic("persistent://acme/traced/plain")
    url = f"{cluster.url}/ws/v2/producer/persistent/acme/traced/plain"
    parent = tracing.start(tracing.CLIENT, "caller")
    assert parent is not None
    old = msgspec.msgpack.encode({"type": "send", "seq": 0, "payload": b"old"})
    malformed = frames.encode(Send(seq=1, payload=b"bad", traceparent="00-nonsense-01"))
    traced = frames.encode(Send(seq=2, payload=b"new", traceparent=tracing.traceparent(parent)))
    assert b"traceparent" not in frames.encode(Send(seq=3, payload=b"x"))  # omitted when unset
    async with aiohttp.ClientSession() as http, http.ws_connect(url) as ws:
        assert isinstance(await next_frame(ws), ProducerReady)
        for data in (old, malformed, traced):
            await ws.send_bytes(data)
        receipts = [await next_frame(ws) for _ in range(3)]
    assert [r.seq for r in receipts if isinstance(r, Receipt)] == [0, 1, 2]
    tracing.end(parent)
    stored = made(spans, tracing.BROKER, "send ")
    assert len(stored) == 1
    assert parent_of(stored[0]) == span_id(only(made(spans, tracing.CLIENT, "caller")))
    assert stored[0].attributes is not None and stored[0].attributes["segtxn.seq"] == 2


async def test_a_line_logged_under_a_span_carries_its_trace_id(
    client: Client, spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    """The coordinator logs a refused commit (the transaction timed out) at INFO, inside
    its END_TXN span: the record has the span's ids, and both log formats show them."""
    caplog.handler.addFilter(tracing.SpanIds())
    caplog.set_level(logging.INFO, logger="segtxn.coordinator")
    txn = await client.transaction(timeout_s=0.2).start()  # NEW_TXN: nothing to race the sweep

    async def aborted() -> bool:
        return await txn.status() == "ABORTED"

    await wait_until(aborted, what="the timeout sweep aborted it")
    with pytest.raises(InvalidTxnStatus):
        await txn.commit()
    served = only(made(spans, tracing.COORDINATOR, "end-txn"))
    refused = [r for r in caplog.records if "COMMIT refused" in r.getMessage()]
    assert len(refused) == 1
    record = refused[0]
    trace_id, span = format(trace_of(served), "032x"), format(span_id(served), "016x")
    assert (getattr(record, "trace_id", None), getattr(record, "span_id", None)) == (
        trace_id,
        span,
    )
    text = TextFormatter(FORMAT).format(record)
    assert text.endswith(f" trace_id={trace_id} span_id={span}")
    line = msgspec.json.decode(JsonFormatter().format(record))
    assert (line["trace_id"], line["span_id"]) == (trace_id, span)
    # a line logged outside any span has no ids
    outside = logging.LogRecord("x", logging.INFO, __file__, 0, "plain", None, None)
    tracing.SpanIds().filter(outside)
    assert not hasattr(outside, "trace_id")
    assert "trace_id" not in TextFormatter(FORMAT).format(outside)
    assert "trace_id" not in msgspec.json.decode(JsonFormatter().format(outside))


async def test_a_transaction_the_sampler_drops_makes_no_span_anywhere(
    cluster: Cluster, client: Client
) -> None:
    """Sampled out at its root (1 in 10^9 kept): nothing of it is recorded, in the client or
    the servers, and a frame naming an unsampled parent makes no span either."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(1e-9)))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    try:
        await client.admin.create_topic(OUT, segments=2)
        orders = await client.subscribe(OUT, "audit", initial_position="earliest")
        producer = await client.create_producer(OUT)
        async with client.transaction() as txn:
            for i in range(4):
                await producer.send(b"x", key=f"k{i}", txn=txn)
            assert txn.span is not None and not txn.span.is_recording()
        await orders.acknowledge(await orders.receive(timeout_s=10))
        await client.admin.create_topic("persistent://acme/traced/plain")
        unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
        url = f"{cluster.url}/ws/v2/producer/persistent/acme/traced/plain"
        async with aiohttp.ClientSession() as http, http.ws_connect(url) as ws:
            assert isinstance(await next_frame(ws), ProducerReady)
            await ws.send_bytes(frames.encode(Send(seq=0, payload=b"x", traceparent=unsampled)))
            assert isinstance(await next_frame(ws), Receipt)
    finally:
        tracing.disable()
        provider.shutdown()
    assert exporter.get_finished_spans() == ()


async def test_tracing_off_makes_no_spans_and_sends_no_context(client: Client) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))  # not enabled: tracing off
    assert not tracing.enabled()
    await client.admin.create_topic(OUT, segments=2)
    orders = await client.subscribe(OUT, "audit", initial_position="earliest")
    producer = await client.create_producer(OUT)
    async with client.transaction() as txn:
        await producer.send(b"x", key="a", txn=txn)
        assert txn.span is None
    await orders.acknowledge(await orders.receive(timeout_s=10))
    assert tracing.start(tracing.CLIENT, "anything") is None
    assert tracing.current_traceparent() is None
    headers: dict[str, str] = {}
    tracing.inject(headers)
    assert headers == {}
    assert exporter.get_finished_spans() == ()
    provider.shutdown()
