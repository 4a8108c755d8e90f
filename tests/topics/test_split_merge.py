"""Splits and merges at run time: no loss, no duplicates, per-key order, atomic transactions."""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import logging
import random
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import ClientWebSocketResponse

from segtxn.client import Client, ErrorName, Message, ScalableProducer, ServerError
from segtxn.client.consumer import Consumer
from segtxn.client.messages import MessageId
from segtxn.protocol import frames
from segtxn.protocol.names import TopicName
from segtxn.topics.catalog import topic_key
from segtxn.topics.controller import Controller
from segtxn.topics.model import ScalableTopic, SegmentState, decode_topic
from tests.cluster import Cluster
from tests.waiting import wait_until
from tests.wsframes import next_frame

TOPIC = "topic://acme/scale/events"


@pytest.fixture
async def client(cluster: Cluster) -> AsyncIterator[Client]:
    async with Client(cluster.url) as c:
        yield c


async def drain(consumer: Consumer, count: int) -> list[Message]:
    out = []
    for _ in range(count):
        message = await consumer.receive(timeout_s=20)
        out.append(message)
        await consumer.acknowledge(message)
    return out


async def test_keyed_stream_across_two_splits_and_a_merge(client: Client) -> None:
    seed = random.randrange(2**32)
    print(f"split/merge seed {seed}")
    rng = random.Random(seed)
    await client.admin.create_topic(TOPIC, segments=2)
    consumer = await client.subscribe(TOPIC, "ordered", initial_position="earliest")
    producer = await client.create_producer(TOPIC)
    assert isinstance(producer, ScalableProducer)
    keys = [f"k{i}" for i in range(40)]
    sent: collections.Counter[str] = collections.Counter()
    total = 3000
    stop_changes = asyncio.Event()

    async def produce() -> None:
        futures = []
        for n in range(total):
            key = rng.choice(keys)
            futures.append(await producer.send_async(f"{key}:{sent[key]}".encode(), key=key))
            sent[key] += 1
            if n % 200 == 0:
                await asyncio.sleep(0)  # let the topology changes interleave
        await asyncio.gather(*futures)
        stop_changes.set()

    async def change_topology() -> None:
        await asyncio.sleep(0.05)  # sleep-ok: let some messages flow before the first split
        await client.admin.split(TOPIC, 0)
        await client.admin.split(TOPIC, 1, at=0xC000)
        layout = await client.connector.lookup(TopicName.parse(TOPIC))
        active = sorted(
            (s for s in layout["segments"] if s["state"] == "ACTIVE"), key=lambda s: s["lo"]
        )
        await client.admin.merge(TOPIC, active[0]["id"], active[1]["id"])

    await asyncio.gather(produce(), change_topology())
    got = await drain(consumer, total)
    by_key: dict[str, list[int]] = collections.defaultdict(list)
    for message in got:
        key, _, seq = message.value.decode().partition(":")
        by_key[key].append(int(seq))
    for key, seqs in by_key.items():
        assert seqs == list(range(sent[key])), f"{key}: out of order or missing"
    assert sum(len(v) for v in by_key.values()) == total  # exactly once
    stats = await client.admin.stats(TOPIC)
    states = {s["id"]: s["state"] for s in stats["segments"]}
    assert list(states.values()).count("SEALED") == 4  # two splits and a merge sealed four


async def test_sends_in_flight_at_a_split_keep_per_key_order(client: Client) -> None:
    """Hundreds of sends in flight when the segment seals: the refused ones go again first,
    so each key is stored in order; a consumer acking concurrently sees every ack confirmed."""
    await client.admin.create_topic(TOPIC, segments=1)
    consumer = await client.subscribe(TOPIC, "ordered", initial_position="earliest")
    producer = await client.create_producer(TOPIC)
    assert isinstance(producer, ScalableProducer)
    keys = [f"k{i}" for i in range(50)]
    sent: collections.Counter[str] = collections.Counter()
    sends: dict[str, list[asyncio.Future[MessageId]]] = collections.defaultdict(list)
    split_done = asyncio.Event()

    async def produce() -> None:
        window: collections.deque[asyncio.Future[MessageId]] = collections.deque()
        n = 0
        while not split_done.is_set() or (producer.reroutes == 0 and n < 50_000):
            key = keys[n % len(keys)]
            future = await producer.send_async(f"{key}:{sent[key]}".encode(), key=key)
            sends[key].append(future)
            window.append(future)
            sent[key] += 1
            n += 1
            if len(window) >= 500:
                await window.popleft()
        await asyncio.gather(*window)

    async def split() -> None:
        await wait_until(lambda: sum(sent.values()) >= 2000, timeout=20)
        await client.admin.split(TOPIC, 0)
        split_done.set()

    await asyncio.gather(produce(), split())
    assert producer.reroutes > 0, "no send reached the sealed segment: nothing was tested"
    for key, futures in sends.items():  # in the order sent, per segment
        stored = [f.result() for f in futures]
        for segment in {i.topic for i in stored}:
            positions = [(i.ledger_id, i.entry_id) for i in stored if i.topic == segment]
            assert positions == sorted(positions), f"{key} stored out of order in {segment}"
    total = sum(sent.values())
    got: dict[str, list[int]] = collections.defaultdict(list)
    acks = []
    for _ in range(total):
        message = await consumer.receive(timeout_s=20)
        key, _, seq = message.value.decode().partition(":")
        got[key].append(int(seq))
        acks.append(asyncio.create_task(consumer.acknowledge(message)))
    results = await asyncio.gather(*acks, return_exceptions=True)
    assert [r for r in results if r is not None] == []
    for key in keys:
        assert got[key] == list(range(sent[key])), f"{key}: out of order, missing or duplicated"
    await consumer.close()


async def test_concurrent_splits_of_one_segment(client: Client) -> None:
    await client.admin.create_topic(TOPIC, segments=1)
    results = await asyncio.gather(
        client.admin.split(TOPIC, 0), client.admin.split(TOPIC, 0), return_exceptions=True
    )
    winners = [r for r in results if isinstance(r, dict)]
    losers = [r for r in results if isinstance(r, ServerError)]
    assert len(winners) == 1 and len(losers) == 1
    assert losers[0].name in (ErrorName.TOPIC_BUSY, ErrorName.INVALID_ARGUMENT)
    with pytest.raises(ServerError) as sealed:
        await client.admin.split(TOPIC, 0)
    assert sealed.value.name is ErrorName.INVALID_ARGUMENT and "sealed" in sealed.value.message
    with pytest.raises(ServerError) as not_adjacent:
        await client.admin.merge(TOPIC, 1, 1)
    assert not_adjacent.value.name is ErrorName.INVALID_ARGUMENT


async def test_transactions_span_a_split_and_a_merge(client: Client) -> None:
    source, sink = "topic://acme/scale/in", "topic://acme/scale/out"
    await client.admin.create_topic(source, segments=1)
    await client.admin.create_topic(sink, segments=2)
    inputs = await client.create_producer(source)
    for i in range(6):
        await inputs.send(f"in{i}".encode(), key=f"k{i}")
    consumer = await client.subscribe(source, "etl", initial_position="earliest")
    outputs = await client.create_producer(sink)
    reader = await client.subscribe(sink, "check", initial_position="earliest")

    committed = await client.transaction().start()
    aborted = await client.transaction().start()
    for _ in range(3):
        message = await consumer.receive(timeout_s=10)
        await outputs.send(b"c" + message.value, key=message.key, txn=committed)
        await consumer.acknowledge(message, txn=committed)
    for i in range(3):
        await outputs.send(f"a{i}".encode(), key=f"k{i}", txn=aborted)
    await client.admin.split(source, 0)  # the acked segment is sealed mid-transaction
    await client.admin.split(sink, 0)  # and so is a written one
    layout = await client.connector.lookup(TopicName.parse(sink))
    active = sorted(
        (s for s in layout["segments"] if s["state"] == "ACTIVE"), key=lambda s: s["lo"]
    )
    await client.admin.merge(sink, active[1]["id"], active[2]["id"])
    await asyncio.wait_for(committed.commit(), 5)  # promptly: no marker to write anywhere
    await asyncio.wait_for(aborted.abort(), 5)
    got = sorted(m.value for m in await drain(reader, 3))
    assert got == [b"cin0", b"cin1", b"cin2"]  # all of the committed one, none of the other
    with pytest.raises(TimeoutError):
        await reader.receive(timeout_s=0.5)  # bounded absence check
    rest = sorted(m.value for m in await drain(consumer, 3))  # the acked three never return
    assert rest == [b"in3", b"in4", b"in5"]


class FailingOnce:
    """SegmentOps whose first seal fails, as if the controller died right after sealing."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.failed = False

    async def subscriptions(self, segment: TopicName) -> list[str]:
        return await self.inner.subscriptions(segment)  # type: ignore[attr-defined,no-any-return]

    async def prepare(self, segment: TopicName, subscriptions: list[str]) -> None:
        await self.inner.prepare(segment, subscriptions)  # type: ignore[attr-defined]

    async def seal(self, segment: TopicName) -> None:
        await self.inner.seal(segment)  # type: ignore[attr-defined]
        if not self.failed:
            self.failed = True
            raise ConnectionError("the controller died here")


async def test_an_interrupted_split_is_finished_by_the_next_controller(
    client: Client, cluster: Cluster
) -> None:
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    await producer.send(b"before", key="a")
    service = cluster.broker.service
    from segtxn.broker.controllers import HttpSegmentOps
    from segtxn.broker.fanout import HTTP

    ops = FailingOnce(HttpSegmentOps(service.catalog, cluster.broker.app[HTTP]))
    name = TopicName.parse(TOPIC)
    with pytest.raises(ConnectionError):
        await Controller(service.store, service.catalog, ops).split(name, 0)
    record = await service.store.get(topic_key(name))
    assert record is not None
    stuck = decode_topic(record.value)
    assert isinstance(stuck, ScalableTopic) and stuck.pending is not None  # the intent is kept
    done = await Controller(service.store, service.catalog, ops).finish(name)
    assert done is not None and done.pending is None
    parent = done.segment(0)
    assert parent is not None and parent.state is SegmentState.SEALED and len(done.active()) == 2
    await producer.send(b"after", key="a")  # re-routed to the child
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
    assert [m.value for m in await drain(consumer, 2)] == [b"before", b"after"]


async def test_failover_members_share_segments_and_take_over(client: Client) -> None:
    await client.admin.create_topic(TOPIC, segments=4)
    first = await client.subscribe(
        TOPIC, "group", subscription_type="Failover", initial_position="earliest", name="m1"
    )
    second = await client.subscribe(
        TOPIC, "group", subscription_type="Failover", initial_position="earliest", name="m2"
    )
    producer = await client.create_producer(TOPIC)
    assert isinstance(producer, ScalableProducer)
    keys: dict[int, str] = {}
    i = 0
    while len(keys) < 4:
        keys.setdefault(producer.route(f"k{i}"), f"k{i}")
        i += 1
    for key in keys.values():
        await producer.send(key.encode(), key=key)
    got_first = {m.message_id.topic for m in await drain(first, 2)}
    got_second = {m.message_id.topic for m in await drain(second, 2)}
    assert len(got_first) == 2 and len(got_second) == 2 and not got_first & got_second
    await first.close()  # the other member takes its segments over
    for key in keys.values():
        await producer.send(key.encode() + b"-again", key=key)
    assert len({m.message_id.topic for m in await drain(second, 4)}) == 4


async def _member(client: Client, segment: TopicName, name: str) -> ClientWebSocketResponse:
    """A Failover member of ``group`` on one segment, on a raw WebSocket we can drop."""
    query = {"type": "Failover", "initial": "earliest", "name": name}
    broker = await client.connector.broker_for(segment)
    ws = await client.connector.websocket(broker, "consumer", segment, "/group", query)
    ready = await next_frame(ws)
    assert isinstance(ready, frames.ConsumerReady)
    await ws.send_bytes(frames.encode(frames.Flow(permits=100)))
    return ws


async def _next_message(ws: ClientWebSocketResponse) -> frames.Message:
    async with asyncio.timeout(10):
        while True:
            frame = await next_frame(ws)
            if isinstance(frame, frames.Message):
                return frame


def _drop(ws: ClientWebSocketResponse) -> None:
    """Cut the TCP connection without a WebSocket close, as a crashed process would."""
    sock = ws.get_extra_info("socket")
    assert sock is not None
    sock.shutdown(socket.SHUT_RDWR)


async def test_a_dropped_member_keeps_its_segment_for_the_hold(client: Client) -> None:
    """m2 holds segment 1 (members m1, m2: segment i to member i mod 2). Dropped, it keeps
    the segment for consumer_hold_s (1 s here) and gets it back on return; gone for good, the
    segment moves to m1 once the hold ends."""
    await client.admin.create_topic(TOPIC, segments=2)
    segment = TopicName.parse(TOPIC).segment_name(1)
    m1 = await client.subscribe(
        TOPIC, "group", subscription_type="Failover", initial_position="earliest", name="m1"
    )
    m2 = await _member(client, segment, "m2")
    producer = await client.create_producer(TOPIC)
    assert isinstance(producer, ScalableProducer)
    key = next(f"k{i}" for i in itertools.count() if producer.route(f"k{i}") == 1)

    await producer.send(b"first", key=key)
    assert (await _next_message(m2)).payload == b"first"
    _drop(m2)
    await producer.send(b"second", key=key)
    with pytest.raises(TimeoutError):
        await m1.receive(timeout_s=0.3)  # bounded absence check: the place is held
    m2 = await _member(client, segment, "m2")  # back within the hold; nothing was acked
    assert [(await _next_message(m2)).payload for _ in range(2)] == [b"first", b"second"]

    _drop(m2)
    dropped = asyncio.get_running_loop().time()
    await producer.send(b"third", key=key)
    taken = [await m1.receive(timeout_s=10)]  # the hold ends: segment 1 moves to m1
    waited = asyncio.get_running_loop().time() - dropped
    taken += [await m1.receive(timeout_s=10) for _ in range(2)]
    assert [m.value for m in taken] == [b"first", b"second", b"third"]
    assert {m.message_id.topic for m in taken} == {str(segment)}
    assert waited >= 0.9, f"m1 took the segment over after {waited:.2f}s, inside the hold"
    await m1.close()


async def test_checkpoint_consumer_resumes_across_a_split(client: Client) -> None:
    await client.admin.create_topic(TOPIC, segments=2)
    producer = await client.create_producer(TOPIC)
    for i in range(10):
        await producer.send(f"a{i}".encode(), key=f"k{i}")
    reader = await client.checkpoint_consumer(TOPIC)
    first = [(await reader.receive(timeout_s=10)).value for _ in range(5)]
    saved = reader.checkpoint()
    await reader.close()
    assert json.loads(json.dumps(saved)) == saved  # the application can store it anywhere
    await client.admin.split(TOPIC, 0)
    for i in range(10):
        await producer.send(f"b{i}".encode(), key=f"k{i}")
    resumed = await client.checkpoint_consumer(TOPIC, saved)
    rest = [(await resumed.receive(timeout_s=10)).value for _ in range(15)]
    assert sorted(first + rest) == sorted(
        [f"a{i}".encode() for i in range(10)] + [f"b{i}".encode() for i in range(10)]
    )
    with pytest.raises(TimeoutError):
        await resumed.receive(timeout_s=0.3)  # bounded absence check: nothing twice
    later = resumed.checkpoint()
    assert 0 in later["finished"]  # the sealed parent was read to its end


async def test_topology_is_visible_in_stats_and_metrics(client: Client, cluster: Cluster) -> None:
    import re

    import aiohttp

    await client.admin.create_topic(TOPIC, segments=2)
    await client.admin.split(TOPIC, 1)
    stats = await client.admin.stats(TOPIC)
    assert stats["activeSegments"] == 3 and stats["epoch"] == 1
    change = stats["lastChange"]
    assert change["kind"] == "split" and change["parents"] == [1] and change["durationMs"] > 0
    assert {s["id"]: s["state"] for s in stats["segments"]}[1] == "SEALED"
    async with aiohttp.ClientSession() as http, http.get(cluster.url + "/metrics") as response:
        metrics = await response.text()
    assert re.search(r'segtxn_topic_changes_total\{[^}]*kind="split"[^}]*\} 1\.0', metrics)
    assert "segtxn_topic_change_seconds_bucket" in metrics


async def test_topology_changes_are_logged_at_info(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """What an operator greps for: the topic, the segments before and after with their ranges,
    the new DAG shape, each seal with the segment's last entry, each child created and loaded;
    not a line per HTTP request."""
    caplog.set_level(logging.INFO)
    await client.admin.create_topic(TOPIC, segments=2)
    producer = await client.create_producer(TOPIC)
    await producer.send(b"x", key="a")
    await client.admin.split(TOPIC, 0)
    await client.admin.merge(TOPIC, 2, 3)
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    segment = TOPIC.replace("topic://", "segment://")
    assert not [r for r in caplog.records if r.name == "aiohttp.access"]  # DEBUG only

    assert f"topic created: {TOPIC}; {segment}/0 [0x0000-0x7fff] on broker b1, " in "\n".join(info)
    assert any(
        line.startswith(
            f"split {TOPIC}: segments 0 [0x0000-0x7fff] -> 2 [0x0000-0x3fff], "
            "3 [0x4000-0x7fff]; epoch 1; active 2 [0x0000-0x3fff], 3 [0x4000-0x7fff], "
            "1 [0x8000-0xffff]; sealed 0->2+3; took "
        )
        for line in info
    ), info
    assert any(
        line.startswith(
            f"merge {TOPIC}: segments 2 [0x0000-0x3fff], 3 [0x4000-0x7fff] -> 4 [0x0000-0x7fff]; "
            "epoch 2; active 4 [0x0000-0x7fff], 1 [0x8000-0xffff]; sealed 3->4, 2->4, 0->2+3; "
        )
        for line in info
    ), info
    last = (await client.admin.stats(f"{segment}/0"))["lastConfirmedPosition"]
    assert [line for line in info if line.startswith("sealed ")] == [
        f"sealed {segment}/0 on broker b1: last entry {last}",  # "L:E", as clients print it
        f"sealed {segment}/2 on broker b1: empty",
        f"sealed {segment}/3 on broker b1: empty",
    ]
    for child in (2, 3, 4):
        assert f"segment created: {segment}/{child}, placed on broker b1" in info
        assert any(line.startswith(f"loaded {segment}/{child} on broker b1: ") for line in info)
