"""The one-step commit, client side (segtxn/client/onestep.py): which transactions ask their
broker to commit, what they send it, and what each answer leads to.

The broker's ``/txn/v2/{txn}/commit`` is played by a small real aiohttp server with scripted
answers; the commit calls the client makes to the cluster's broker are sent there instead,
and everything else (sends, acks, END_TXN, status) goes to the real cluster. A commit asked
as a frame on a producer's connection (``frame``: what the client does when it holds one)
gets the same script's answer as a frame, or its error; ``http`` (the default here): over
HTTP, as without such a connection. The frame's own path, against a real broker:
tests/txn/test_one_step_commit.py. A scripted
COMMITTED is made true first: the script waits for the transaction's operations, then
commits it at the real coordinator, as the broker's store step would."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from segtxn.client import Client, TransactionFailed
from segtxn.client.commitchannel import CommitChannel
from segtxn.client.connection import Connector
from segtxn.client.consumer import Consumer
from segtxn.client.coordinators import Coordinators
from segtxn.client.errors import Timeout
from segtxn.client.messages import Message, MessageId
from segtxn.client.onestep import Placements
from segtxn.client.scalable import ScalableProducer
from segtxn.client.timeouts import Deadline
from segtxn.client.transaction import Transaction
from segtxn.protocol.errors import (
    ErrorName,
    InvalidTxnStatus,
    TransactionNotFound,
    server_error,
)
from segtxn.protocol.frames import CommitAnswer
from segtxn.protocol.txn import TxnAction, TxnId
from segtxn.protocol.txnops import ack_op, digest, send_op
from tests.cluster import Cluster

pytestmark = pytest.mark.parametrize("cluster", ["memory"], indirect=True)

TOPIC = "topic://acme/onestep/out"
INPUT = "topic://acme/onestep/in"

Script = Callable[[str], Awaitable[web.Response]]


@dataclass
class ScriptedBroker:
    """The commit endpoint of a broker, answering with :attr:`script`."""

    cluster: Cluster
    url: str = ""
    via: str = "http"
    """How the client asks: ``http`` or ``frame`` (a producer connection's commit frame)."""
    asked: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    script: Script | None = None

    async def handle(self, request: web.Request) -> web.Response:
        txn = request.match_info["txn"]
        self.asked.append((txn, await request.json()))
        assert self.script is not None, "a commit was asked for where none should be"
        return await self.script(txn)

    async def end(self, txn: str, action: TxnAction) -> None:
        """END_TXN at the real coordinator, as the broker's store step would commit."""
        url = self.cluster.coordinator.settings.advertise_url
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{url}/txn/v2/{txn}/end", params={"action": action.value}) as reply,
        ):
            assert reply.status == 200, await reply.text()


@pytest.fixture
async def broker(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> AsyncIterator[ScriptedBroker]:
    scripted = ScriptedBroker(cluster, via=getattr(request, "param", "http"))
    app = web.Application()
    app.router.add_post("/txn/v2/{txn}/commit", scripted.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    scripted.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    original = Connector.request

    async def rerouted(self: Connector, method: str, path: str, **kwargs: Any) -> Any:
        if path.startswith(cluster.url) and path.endswith("/commit"):
            path = scripted.url + path[len(cluster.url) :]
        return await original(self, method, path, **kwargs)

    async def as_frame(
        channel: CommitChannel, txn: TxnId, ops: int, summed: int, timeout_s: float | None
    ) -> CommitAnswer:
        """The script's answer as the broker's frame would carry it (its error raised)."""
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"{scripted.url}/txn/v2/{txn}/commit", json={"ops": ops, "digest": summed}
            ) as reply,
        ):
            body = await reply.json()
        if reply.status != 200:
            raise server_error(ErrorName.parse(body["error"]), body["message"])
        return CommitAnswer(request_id=1, state=body["state"], reason=body.get("reason", ""))

    monkeypatch.setattr(Connector, "request", rerouted)
    if scripted.via == "frame":
        monkeypatch.setattr(CommitChannel, "commit", as_frame)
    else:
        monkeypatch.setattr(Placements, "channel", lambda self, url: None)
    try:
        yield scripted
    finally:
        await runner.cleanup()


@pytest.fixture
def ended(monkeypatch: pytest.MonkeyPatch) -> list[TxnAction]:
    """The END_TXN actions the client sends to a coordinator."""
    actions: list[TxnAction] = []
    end = Coordinators.end

    async def spy(self: Coordinators, txn: Any, action: TxnAction, *args: Any) -> None:
        actions.append(action)
        await end(self, txn, action, *args)

    monkeypatch.setattr(Coordinators, "end", spy)
    return actions


def answer(state: str) -> Script:
    async def script(txn: str) -> web.Response:
        return web.json_response({"state": state, "reason": "scripted"})

    return script


def error(name: str, status: int) -> web.Response:
    return web.json_response({"error": name, "message": "scripted"}, status=status)


@dataclass
class Work:
    """A transaction with sends (not awaited) and one ack (not awaited) in it."""

    txn: Transaction
    producer: ScalableProducer
    sends: list[asyncio.Future[MessageId]]
    ack: asyncio.Future[None]
    acked: Message
    consumer: Consumer

    def operations(self) -> list[asyncio.Future[Any]]:
        return [*self.sends, self.ack]

    async def names(self) -> set[str]:
        """The operation names the client must have counted (once the sends are done)."""
        ids = [await f for f in self.sends]
        by_segment = {str(p.topic): p.name for p in self.producer._producers.values()}
        seqs: dict[str, int] = {}
        names = set()
        for i in ids:
            seq = seqs[i.topic] = seqs.get(i.topic, -1) + 1  # a fresh producer: 0, 1, ...
            names.add(send_op(i.topic, by_segment[i.topic], seq))
        acked = self.acked.message_id
        return names | {ack_op(acked.topic, "sub", (acked.ledger_id, acked.entry_id), False)}


def _placements(txn: Transaction) -> Placements:
    placements = txn.placements
    assert placements is not None
    return placements


async def work(client: Client, n: int = 3) -> Work:
    await client.admin.create_topic(TOPIC, segments=2)
    await client.admin.create_topic(INPUT, segments=1)
    consumer = await client.subscribe(INPUT, "sub", initial_position="earliest")
    plain = await client.create_producer(INPUT)
    await plain.send(b"input")
    message = await consumer.receive(timeout_s=10)
    producer = await client.create_producer(TOPIC)
    assert isinstance(producer, ScalableProducer)
    txn = client.transaction()
    sends = [await producer.send_async(f"m{i}".encode(), key=f"k{i}", txn=txn) for i in range(n)]
    ack = await consumer.acknowledge_async(message, txn=txn)
    return Work(txn, producer, sends, ack, message, consumer)


def committing(broker: ScriptedBroker, w: Work, *, then: Script | None = None) -> Script:
    """Wait for the operations, commit at the coordinator, then answer COMMITTED (or
    ``then``)."""

    async def script(txn: str) -> web.Response:
        await asyncio.wait(w.operations())
        await broker.end(txn, TxnAction.COMMIT)
        return await (then or answer("COMMITTED"))(txn)

    return script


@pytest.mark.parametrize("broker", ["http", "frame"], indirect=True)
async def test_one_broker_commits_there_in_one_step(
    client: Client, broker: ScriptedBroker, ended: list[TxnAction]
) -> None:
    w = await work(client)
    broker.script = committing(broker, w)
    await w.txn.commit()
    assert w.txn.state == "COMMITTED" and w.txn.committed_by == "broker"
    assert ended == []  # no END_TXN
    assert all(f.done() for f in w.operations())  # commit() returned after them
    [(txn, body)] = broker.asked
    assert txn == str(w.txn.id)
    assert body == {"ops": 4, "digest": digest(await w.names())}
    assert await w.txn.status() == "COMMITTED"


@pytest.mark.parametrize("broker", ["http", "frame"], indirect=True)
async def test_not_here_ends_it_at_the_coordinator(
    client: Client, broker: ScriptedBroker, ended: list[TxnAction]
) -> None:
    w = await work(client)
    broker.script = answer("OPEN")  # at once: the operations may still be in flight
    await w.txn.commit()
    assert w.txn.state == "COMMITTED" and w.txn.committed_by == "coordinator"
    assert ended == [TxnAction.COMMIT]
    assert len(broker.asked) == 1
    assert await w.txn.status() == "COMMITTED"


@pytest.mark.parametrize("refusal", [("InvalidTxnStatus", 409), ("TransactionNotFound", 404)])
@pytest.mark.parametrize("broker", ["http", "frame"], indirect=True)
async def test_a_refusal_ends_it_aborted(
    client: Client, broker: ScriptedBroker, ended: list[TxnAction], refusal: tuple[str, int]
) -> None:
    """As END_TXN's refusal: ABORTED, raised, and what it acknowledged comes again."""
    w = await work(client)

    async def script(txn: str) -> web.Response:
        await asyncio.wait(w.operations())
        await broker.end(txn, TxnAction.ABORT)  # it timed out first
        return error(*refusal)

    broker.script = script
    with pytest.raises(
        InvalidTxnStatus if refusal[0] == "InvalidTxnStatus" else TransactionNotFound
    ):
        await w.txn.commit()
    assert w.txn.state == "ABORTED" and w.txn.committed_by is None
    assert ended == []
    assert await w.txn.status() == "ABORTED"
    again = await w.consumer.receive(timeout_s=10)  # the redelivery the abort asked for
    assert again.value == w.acked.value and again.redelivery_count > 0


@pytest.mark.parametrize("broker", ["http", "frame"], indirect=True)
async def test_no_answer_then_the_coordinator_confirms(
    client: Client, broker: ScriptedBroker, ended: list[TxnAction]
) -> None:
    """The broker committed but its answer was lost: END_TXN(COMMIT) repeats the decision."""
    w = await work(client)
    broker.script = committing(broker, w, then=lambda _: _error_now("ServiceNotReady", 503))
    await w.txn.commit()
    assert w.txn.state == "COMMITTED" and w.txn.committed_by == "coordinator"
    assert ended == [TxnAction.COMMIT]
    assert await w.txn.status() == "COMMITTED"


async def _error_now(name: str, status: int) -> web.Response:
    return error(name, status)


@pytest.mark.parametrize("landed", [True, False])
async def test_no_answer_and_a_failed_operation(
    client: Client, broker: ScriptedBroker, ended: list[TxnAction], landed: bool
) -> None:
    """An operation's own answer failed while the broker's commit got no answer: the client
    aborts at the coordinator; refused there because the commit landed, it reads the
    state and reports the commit; otherwise the transaction is aborted."""
    w = await work(client)
    receipt: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    w.txn.operations.track(receipt)  # an operation whose receipt will be lost
    _placements(w.txn).placed(receipt, client.connector.service_url, "s lost")

    async def script(txn: str) -> web.Response:
        await asyncio.wait(w.operations())
        if landed:
            await broker.end(txn, TxnAction.COMMIT)
        receipt.set_exception(Timeout("no receipt in time"))
        return error("ServiceNotReady", 503)

    broker.script = script
    if landed:
        await w.txn.commit()
        assert w.txn.state == "COMMITTED" and w.txn.committed_by == "broker"
    else:
        with pytest.raises(TransactionFailed):
            await w.txn.commit()
        assert w.txn.state == "ABORTED"
    assert ended == [TxnAction.ABORT]
    assert await w.txn.status() == ("COMMITTED" if landed else "ABORTED")


async def test_committed_whatever_an_operation_answered(
    client: Client,
    broker: ScriptedBroker,
    ended: list[TxnAction],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """COMMITTED: commit() waits for the operations still in flight, and reports the
    commit even if one's own answer fails (its receipt lost): the broker counted it by
    name, so it was applied."""
    w = await work(client)
    receipt: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    w.txn.operations.track(receipt)
    _placements(w.txn).placed(receipt, client.connector.service_url, "s lost")
    settling = asyncio.Event()
    settle = w.txn.operations.settle

    async def watched(deadline: Deadline) -> bool:
        settling.set()
        return await settle(deadline)

    monkeypatch.setattr(w.txn.operations, "settle", watched)
    broker.script = committing(broker, w)  # the receipt still in flight
    commit = asyncio.create_task(w.txn.commit())
    async with asyncio.timeout(10):
        await settling.wait()
    assert not commit.done() and w.txn.state == "COMMITTING"
    receipt.set_exception(Timeout("no receipt in time"))
    async with asyncio.timeout(10):
        await commit
    assert w.txn.state == "COMMITTED" and w.txn.committed_by == "broker"
    assert ended == []


async def test_two_brokers_end_it_at_the_coordinator(
    client: Client, broker: ScriptedBroker, ended: list[TxnAction]
) -> None:
    w = await work(client)
    _placements(w.txn).placed(
        w.sends[0], "http://127.0.0.1:1", "s elsewhere"
    )  # a resend went elsewhere
    await w.txn.commit()
    assert broker.asked == []
    assert w.txn.committed_by == "coordinator" and ended == [TxnAction.COMMIT]


async def test_a_failed_transaction_is_not_committed_at_a_broker(
    client: Client, broker: ScriptedBroker, ended: list[TxnAction]
) -> None:
    w = await work(client)
    with pytest.raises(TypeError):
        await w.producer.send("not bytes", txn=w.txn)  # type: ignore[arg-type]
    with pytest.raises(TransactionFailed):
        await w.txn.commit()
    assert broker.asked == []
    assert ended == [TxnAction.ABORT] and w.txn.state == "ABORTED"


async def test_v4_and_nothing_placed_and_off_use_the_coordinator(
    cluster: Cluster, client: Client, broker: ScriptedBroker, ended: list[TxnAction]
) -> None:
    v4 = "persistent://acme/onestep/v4"
    await client.admin.create_topic(v4)
    producer = await client.create_producer(v4)
    txn = client.transaction()
    await producer.send(b"v4", txn=txn)
    await txn.commit()
    empty = await client.transaction().start()  # v5, nothing placed
    await empty.commit()
    async with Client(cluster.url, one_step_commit=False) as off:
        w = await work(off)
        await w.txn.commit()
    assert broker.asked == []
    assert ended == [TxnAction.COMMIT] * 3
    assert [t.committed_by for t in (txn, empty, w.txn)] == ["coordinator"] * 3


@pytest.mark.parametrize("broker", ["http", "frame"], indirect=True)
async def test_error_replies_decide_nothing(
    client: Client, broker: ScriptedBroker, ended: list[TxnAction]
) -> None:
    """InvalidArgument (an older broker: no such route) is "not here"."""
    w = await work(client)
    broker.script = lambda _: _error_now("InvalidArgument", 404)
    await w.txn.commit()
    assert len(broker.asked) == 1
    assert w.txn.committed_by == "coordinator" and ended == [TxnAction.COMMIT]
