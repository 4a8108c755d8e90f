"""The one-step commit asked as a ``commit`` frame on a producer's connection
(segtxn/client/commitchannel.py, the broker's segtxn/broker/txncommit.py), against a real
broker and store: what the client does when it holds such a connection, the frame's
answers and refusals on the wire, a connection lost with a commit waiting, and a broker
that cannot read the frame (an older one)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web

from segtxn.broker import txncommit
from segtxn.broker.outbox import Outbox
from segtxn.broker.service import BrokerService
from segtxn.broker.txn.buffer import MetadataTransactionBuffer
from segtxn.client import Client
from segtxn.client.connection import Connector
from segtxn.protocol import frames
from segtxn.protocol.frames import Commit, CommitAnswer, Error, Receipt, Send, SendBatch
from segtxn.protocol.names import TopicName
from segtxn.protocol.txn import TxnId, TxnState
from segtxn.protocol.txnops import digest, send_op
from segtxn.topics import transactions as T
from tests.cluster import Cluster
from tests.txn.test_one_step_commit import OUT_SEGMENT, _header, _read_out, _setup
from tests.waiting import wait_until
from tests.wsframes import next_frame

WS_PRODUCER = "/ws/v2/producer/" + TopicName.parse(OUT_SEGMENT).path


@pytest.fixture
def http_commits(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The one-step commits the client asks over HTTP (their URLs)."""
    asked: list[str] = []
    request = Connector.request

    async def spy(self: Connector, method: str, path: str, **kwargs: Any) -> Any:
        if path.endswith("/commit"):
            asked.append(path)
        return await request(self, method, path, **kwargs)

    monkeypatch.setattr(Connector, "request", spy)
    return asked


async def test_a_client_with_a_producer_there_asks_on_its_connection(
    client: Client, cluster: Cluster, http_commits: list[str]
) -> None:
    consumer, message, out = await _setup(client)
    async with client.transaction() as txn:
        await out.send_async(b"a", txn=txn)
        await consumer.acknowledge_async(message, txn=txn)
    assert txn.committed_by == "broker"
    assert http_commits == []  # the frame, not a request
    assert (await _header(cluster, txn.id)).state is TxnState.COMMITTED
    assert await _read_out(client, 2) == [b"warm-up", b"a"]


async def test_acknowledgments_alone_are_committed_over_http(
    client: Client, cluster: Cluster, http_commits: list[str]
) -> None:
    """No producer connection placed anything: the request is the way left."""
    consumer, message, _out = await _setup(client)
    async with client.transaction() as txn:
        await consumer.acknowledge_async(message, txn=txn)
    assert txn.committed_by == "broker"
    assert len(http_commits) == 1


@pytest.fixture
async def producer_ws(cluster: Cluster, client: Client) -> AsyncIterator[Any]:
    """A raw producer connection to OUT's segment (after it is loaded)."""
    await _setup(client)
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(cluster.url + WS_PRODUCER, params={"name": "raw"}) as ws,
    ):
        ready = frames.server_frame.decode((await ws.receive()).data)
        assert isinstance(ready, frames.ProducerReady)
        yield ws


async def _answer(ws: Any, frame: frames.Frame) -> Any:
    await ws.send_bytes(frames.encode(frame))
    async with asyncio.timeout(10):
        while True:
            answer = frames.server_frame.decode((await ws.receive()).data)
            if isinstance(answer, CommitAnswer | Error) and answer.request_id is not None:
                return answer


async def test_the_frame_commits_what_its_connection_sent(
    client: Client, cluster: Cluster, producer_ws: Any
) -> None:
    txn = (await client.transaction().start()).id
    send = Send(seq=0, payload=b"raw", txn=(txn.most, txn.least))
    await producer_ws.send_bytes(frames.encode(send))
    names = [send_op(OUT_SEGMENT, "raw", 0)]
    commit = Commit(request_id=7, txn=(txn.most, txn.least), ops=1, digest=digest(names))
    assert await _answer(producer_ws, commit) == CommitAnswer(request_id=7, state="COMMITTED")
    assert (await _header(cluster, txn)).state is TxnState.COMMITTED
    again = await _answer(producer_ws, msgspec.structs.replace(commit, request_id=8))
    assert again == CommitAnswer(request_id=8, state="COMMITTED")  # asked again: the same


async def test_a_commit_waiting_for_later_sends_outlasts_a_full_publish_buffer(
    client: Client, cluster: Cluster
) -> None:
    """The sends it waits for come after it, more of them than the broker's publish buffer
    holds: those in flight end without it, and give their room to the next ones."""
    await _setup(client)
    service = cluster.broker.service
    service.publish_budget.limit = 3 * 1000  # (nothing in flight now)
    txn = (await client.transaction().start()).id
    names = [send_op(OUT_SEGMENT, "raw", seq) for seq in range(10)]
    commit = Commit(request_id=5, txn=(txn.most, txn.least), ops=10, digest=digest(names))
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(cluster.url + WS_PRODUCER, params={"name": "raw"}) as ws,
    ):
        assert isinstance(await next_frame(ws), frames.ProducerReady)
        await ws.send_bytes(frames.encode(commit))
        for seq in range(10):
            send = Send(seq=seq, payload=b"%d" % seq + b"." * 999, txn=(txn.most, txn.least))
            await ws.send_bytes(frames.encode(send))
        answers = [await next_frame(ws) for _ in range(11)]
    assert CommitAnswer(request_id=5, state="COMMITTED") in answers
    receipts = [a for a in answers if isinstance(a, Receipt)]
    assert sorted(r.seq for r in receipts) == list(range(10))
    assert service.publish_budget.in_use == 0
    assert (await _header(cluster, txn)).state is TxnState.COMMITTED


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"ops": 0}, "InvalidArgument"),
        ({"digest": -1}, "InvalidArgument"),
        ({"ops": -5}, "InvalidArgument"),
        ({"txn": (-1, 1)}, "InvalidArgument"),
        ({"txn": (1 << 48 | 1, 999)}, "TransactionNotFound"),
        ({"txn": (1, 1)}, "NotAllowed"),  # a v4 id: its coordinator ends it
    ],
)
async def test_a_bad_frame_is_refused_by_its_request_id_and_the_connection_goes_on(
    client: Client, producer_ws: Any, fields: dict[str, Any], error: str
) -> None:
    txn = (await client.transaction().start()).id
    commit = Commit(request_id=3, txn=(txn.most, txn.least), ops=1, digest=0)
    refused = await _answer(producer_ws, msgspec.structs.replace(commit, **fields))
    assert isinstance(refused, Error)
    assert (refused.error, refused.request_id) == (error, 3)
    answer = await _answer(producer_ws, msgspec.structs.replace(commit, request_id=4))
    assert isinstance(answer, CommitAnswer)  # the connection goes on
    assert (answer.request_id, answer.state) == (4, "OPEN")  # (nothing of it here)


async def test_a_connection_lost_with_the_commit_waiting_leaves_it_to_the_coordinator(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker hangs up as the frame arrives and commits anyway: the client cannot
    know, so it waits for its operations (sent again on the new connection) and asks the
    coordinator, which finds the decision made; each message is there once."""
    consumer, message, out = await _setup(client)
    answer_frame = txncommit.answer_frame

    async def hang_up_first(
        service: BrokerService, principal: Any, frame: Commit, reply: Any
    ) -> None:
        topic = service.topics[TopicName.parse(OUT_SEGMENT)]
        for ws in list(topic.producers.values()):
            assert isinstance(ws, web.WebSocketResponse)
            await ws.close()
        await answer_frame(service, principal, frame, reply)

    monkeypatch.setattr(txncommit, "answer_frame", hang_up_first)
    async with client.transaction() as txn:
        await out.send_async(b"a", txn=txn)
        await consumer.acknowledge_async(message, txn=txn)
    assert txn.committed_by == "coordinator"
    assert (await _header(cluster, txn.id)).state is TxnState.COMMITTED
    assert await _read_out(client, 2) == [b"warm-up", b"a"]
    await out.send(b"after")
    assert await _read_out(client, 3) == [b"warm-up", b"a", b"after"]  # no second "a"


async def test_a_broker_that_cannot_read_the_frame_leaves_it_to_the_coordinator(
    client: Client, cluster: Cluster, http_commits: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older broker answers the frame InvalidMessage without naming it: nothing was
    decided; the client commits at the coordinator and asks that broker over HTTP after."""
    monkeypatch.setattr(frames, "producer_input", msgspec.msgpack.Decoder(Send | SendBatch))
    consumer, message, out = await _setup(client)
    async with client.transaction() as txn:
        await out.send_async(b"a", txn=txn)
    assert txn.committed_by == "coordinator"
    assert http_commits == []
    async with client.transaction() as later:
        await out.send_async(b"b", txn=later)
        await consumer.acknowledge_async(message, txn=later)
    assert later.committed_by == "broker"
    assert len(http_commits) == 1
    assert await _read_out(client, 3) == [b"warm-up", b"a", b"b"]


async def test_the_answer_goes_before_the_segments_materialize_the_commit(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's watch event for the COMMITTED header reaches the broker before the answer
    to the step that wrote it (made so here: the step's answer is parked until the header
    cache holds the COMMITTED header). The commit's answer is queued first, and the segment
    materializes the outcome after it: at 64 segments those materializations took a quarter
    of the commit's time, ahead of its answer (issue 16)."""
    _, _, out = await _setup(client)
    order: list[str] = []
    materialize = MetadataTransactionBuffer._materialize

    def materializing(self: MetadataTransactionBuffer, txn: TxnId, header: Any) -> None:
        order.append("materialized")
        materialize(self, txn, header)

    monkeypatch.setattr(MetadataTransactionBuffer, "_materialize", materializing)
    send = Outbox.send

    def sending(self: Outbox, frame: frames.Frame) -> None:
        if isinstance(frame, CommitAnswer):
            order.append(f"answered {frame.state}")
        send(self, frame)

    monkeypatch.setattr(Outbox, "send", sending)
    txn = await client.transaction().start()
    await out.send(b"a", txn=txn)  # stored and recorded: the commit's step is the CAS alone
    headers = cluster.broker.service.headers
    step = cluster.faults.hold("txn", key_prefix=T.header_key(txn.id))
    committing = asyncio.ensure_future(txn.commit())
    await step.wait_for(1)

    def seen_committed() -> bool:
        header = headers.cached(txn.id)
        return header is not None and header.state is TxnState.COMMITTED

    await wait_until(seen_committed, what="the watch brought the COMMITTED header")
    assert order == []  # held: nothing materialized before the answer
    step.release()
    await asyncio.wait_for(committing, 10)
    assert txn.committed_by == "broker"
    await wait_until(lambda: "materialized" in order, what="the segment materialized it")
    assert order == ["answered COMMITTED", "materialized"]
    assert await _read_out(client, 2) == [b"warm-up", b"a"]
