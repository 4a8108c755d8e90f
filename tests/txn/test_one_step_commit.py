"""The one-step commit, broker side (``POST /txn/v2/{txn}/commit``): a transaction whose
operations all went to one broker is committed by the op-record step that writes its last
records, once the operations recorded there are exactly those the client names (count and
digest); "not here" otherwise, with nothing decided. These tests call the endpoint as a
client would, naming the operations themselves (segtxn/protocol/txnops.py).

Each interleaving is made on purpose: the store's answer to a chosen call is parked
(``cluster.faults.hold``) or made to fail, before or after it applies."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from segtxn.broker.txn import commits
from segtxn.client import Client, Message, ScalableProducer
from segtxn.client.consumer import Consumer
from segtxn.client.transaction import Transaction
from segtxn.protocol import txnops
from segtxn.protocol.names import TopicName
from segtxn.protocol.txn import TxnId, TxnState
from segtxn.topics import transactions as T
from tests.cluster import Cluster
from tests.waiting import wait_until

TOPIC = "topic://acme/onestep/in"
OUT = "topic://acme/onestep/out"
SEGMENT = str(TopicName.parse(TOPIC).segment_name(0))
OUT_SEGMENT = str(TopicName.parse(OUT).segment_name(0))


async def _setup(client: Client) -> tuple[Consumer, Message, ScalableProducer]:
    """A message received from TOPIC, and a producer on OUT whose segment is loaded."""
    await client.admin.create_topic(TOPIC, segments=1)
    await client.admin.create_topic(OUT, segments=1)
    await (await client.create_producer(TOPIC)).send(b"in")
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
    message = await consumer.receive(timeout_s=10)
    out = await client.create_producer(OUT)
    assert isinstance(out, ScalableProducer)
    await out.send(b"warm-up")
    return consumer, message, out


def _names(out: ScalableProducer, seqs: list[int], message: Message | None) -> list[str]:
    """The names of sends ``seqs`` of ``out``'s segment producer and of an ack of
    ``message`` on subscription ``s``."""
    (inner,) = out._producers.values()
    names = [txnops.send_op(OUT_SEGMENT, inner.name, seq) for seq in seqs]
    if message is not None:
        position = (message.message_id.ledger_id, message.message_id.entry_id)
        names.append(txnops.ack_op(SEGMENT, "s", position, False))
    return names


def _next_seq(out: ScalableProducer) -> int:
    (inner,) = out._producers.values()
    return inner._next_seq


async def _one_send(client: Client, *, acked: bool = True) -> tuple[Transaction, list[str]]:
    """An open transaction that sent one message to OUT and (``acked``) acknowledged TOPIC's
    message, and the names of that send and that ack (named even when not made)."""
    consumer, message, out = await _setup(client)
    txn = await client.transaction().start()
    seq = _next_seq(out)
    await out.send(b"out", txn=txn)
    if acked:
        await consumer.acknowledge(message, txn=txn)
    return txn, _names(out, [seq], message)


async def _commit(
    cluster: Cluster, txn: TxnId, names: list[str], *, body: Any = None
) -> tuple[int, dict[str, Any]]:
    payload = {"ops": len(names), "digest": txnops.digest(names)} if body is None else body
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{cluster.url}/txn/v2/{txn}/commit", json=payload) as response,
    ):
        return response.status, await response.json()


async def _header(cluster: Cluster, txn: TxnId) -> T.TxnHeader:
    record = await cluster.store.get(T.header_key(txn))
    assert record is not None
    return T.decode_header(record.value)


async def _read_out(client: Client, count: int) -> list[bytes]:
    reader = await client.create_reader(OUT_SEGMENT, start="earliest")
    try:
        return [(await reader.receive(timeout_s=10)).value for _ in range(count)]
    finally:
        await reader.close()


async def test_a_transaction_whose_operations_are_all_here_commits_here(
    client: Client, cluster: Cluster
) -> None:
    txn, names = await _one_send(client)
    status, answer = await _commit(cluster, txn.id, names)
    assert (status, answer) == (200, {"state": "COMMITTED"})
    assert (await _header(cluster, txn.id)).state is TxnState.COMMITTED
    assert cluster.coordinator.coordinator.counters["committed"] == 0  # no END_TXN
    assert not cluster.broker.service.op_records._commits._counted  # nothing kept
    assert await _read_out(client, 2) == [b"warm-up", b"out"]
    status, answer = await _commit(cluster, txn.id, names)
    assert (status, answer) == (200, {"state": "COMMITTED"})  # asked again: the same


async def test_a_commit_asked_before_its_operations_rides_on_their_record_step(
    client: Client, cluster: Cluster
) -> None:
    """The records of the send and the ack and the header's compare-and-set go in one store
    step: the header is never written on its own."""
    consumer, message, out = await _setup(client)
    txn = await client.transaction().start()
    seq = _next_seq(out)
    names = _names(out, [seq, seq + 1], message)
    asked = asyncio.ensure_future(_commit(cluster, txn.id, names))
    await wait_until(lambda: txn.id in cluster.broker.service.op_records._commits._pending)
    header_writes = cluster.faults.count("txn", key_prefix=T.header_key(txn.id))
    record_writes = cluster.faults.count("txn", key_prefix=T.ops_prefix(txn.id))
    sent = [await out.send_async(v, txn=txn) for v in (b"a", b"b")]
    acked = await consumer.acknowledge_async(message, txn=txn)
    assert await asked == (200, {"state": "COMMITTED"})
    await asyncio.gather(*sent, acked)
    assert header_writes.calls == 1
    assert record_writes.calls == 1  # the same step: the records and the decision
    assert await _read_out(client, 3) == [b"warm-up", b"a", b"b"]


@pytest.mark.parametrize("wrong", ["count", "digest"])
async def test_other_operations_than_those_named_are_not_committed_here(
    client: Client, cluster: Cluster, wrong: str
) -> None:
    txn, names = await _one_send(client)
    named = names[:1] if wrong == "count" else [names[0], names[1] + "x"]
    status, answer = await _commit(cluster, txn.id, named)
    assert status == 200
    assert answer["state"] == "OPEN"
    assert "not the" in answer["reason"]
    assert (await _header(cluster, txn.id)).state is TxnState.OPEN
    await txn.commit()  # its coordinator still can
    assert (await _header(cluster, txn.id)).state is TxnState.COMMITTED


async def test_an_operation_that_never_arrives_makes_it_not_here_in_time(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commits, "COMMIT_WAIT_S", 0.3)
    txn, names = await _one_send(client, acked=False)  # the ack is named, never made
    status, answer = await _commit(cluster, txn.id, names)
    assert (status, answer["state"]) == (200, "OPEN")
    assert "in time" in answer["reason"]
    assert (await _header(cluster, txn.id)).state is TxnState.OPEN
    assert not cluster.broker.service.op_records._commits._pending


async def test_a_commit_waits_on_while_its_operations_keep_arriving(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wait is measured from the last operation that arrived: past the first wait, a
    commit whose operations are still coming commits here (a large transaction is not
    sent to its coordinator for taking long to send)."""
    _consumer, _message, out = await _setup(client)
    txn = await client.transaction().start()
    seq = _next_seq(out)
    names = _names(out, [seq, seq + 1], None)
    monkeypatch.setattr(commits, "COMMIT_WAIT_S", 0.3)
    asked = asyncio.ensure_future(_commit(cluster, txn.id, names))
    await wait_until(lambda: txn.id in cluster.broker.service.op_records._commits._pending)
    first_expiry = cluster.broker.service.op_records._commits._pending[txn.id].expires
    monkeypatch.setattr(commits, "COMMIT_WAIT_S", 60.0)  # from the first operation on
    first = await out.send_async(b"a", txn=txn)
    commits_here = cluster.broker.service.op_records._commits
    counted = commits_here._counted
    await wait_until(lambda: txn.id in counted and len(counted[txn.id].names) == 1)
    loop = asyncio.get_running_loop()
    await wait_until(lambda: loop.time() > first_expiry)  # the first wait is over
    assert not asked.done()
    second = await out.send_async(b"b", txn=txn)
    assert await asked == (200, {"state": "COMMITTED"})
    await asyncio.gather(first, second)
    assert await _read_out(client, 3) == [b"warm-up", b"a", b"b"]


async def test_a_failed_record_step_refuses_the_commit_and_decides_nothing(
    client: Client, cluster: Cluster
) -> None:
    _consumer, _message, out = await _setup(client)
    txn = await client.transaction().start()
    seq = _next_seq(out)
    names = _names(out, [seq], None)
    asked = asyncio.ensure_future(_commit(cluster, txn.id, names))
    await wait_until(lambda: txn.id in cluster.broker.service.op_records._commits._pending)
    cluster.faults.fail("txn", key_prefix=T.ops_prefix(txn.id))  # before it applies
    sent = await out.send_async(b"out", txn=txn)
    status, answer = await asked
    assert (status, answer["state"]) == (200, "OPEN")
    assert "could not record" in answer["reason"]
    with pytest.raises(Exception, match="could not record"):
        await sent
    header = await _header(cluster, txn.id)
    # the abort that settled the unknown outcome (the step failed as it was made)
    assert header.state is TxnState.ABORTED


async def test_a_lost_answer_of_the_committing_step_is_found_committed(
    client: Client, cluster: Cluster
) -> None:
    """The step lands and its answer is lost: the broker finds the header COMMITTED, so
    the records landed too, and says so (the send succeeds, its entry is visible)."""
    _consumer, _message, out = await _setup(client)
    txn = await client.transaction().start()
    seq = _next_seq(out)
    names = _names(out, [seq], None)
    asked = asyncio.ensure_future(_commit(cluster, txn.id, names))
    await wait_until(lambda: txn.id in cluster.broker.service.op_records._commits._pending)
    cluster.faults.fail("txn", key_prefix=T.ops_prefix(txn.id), after_apply=True)
    sent = await out.send_async(b"out", txn=txn)
    assert await asked == (200, {"state": "COMMITTED"})
    await sent
    assert (await _header(cluster, txn.id)).state is TxnState.COMMITTED
    assert await _read_out(client, 2) == [b"warm-up", b"out"]


async def test_refusals_are_end_txns(client: Client, cluster: Cluster) -> None:
    await _setup(client)
    aborted = await client.transaction().start()
    await aborted.abort()
    status, answer = await _commit(cluster, aborted.id, ["x"])
    assert (status, answer["error"]) == (409, "InvalidTxnStatus")
    missing = TxnId(aborted.id.most, aborted.id.least + 1000)
    status, answer = await _commit(cluster, missing, ["x"])
    assert (status, answer["error"]) == (404, "TransactionNotFound")
    status, answer = await _commit(cluster, TxnId(1, 1), ["x"])
    assert (status, answer["error"]) == (405, "NotAllowed")
    for body in ({"ops": 0, "digest": 1}, {"ops": 1}, {"ops": 1, "digest": -1}, [1], "x"):
        status, answer = await _commit(cluster, aborted.id, [], body=body)
        assert (status, answer["error"]) == (400, "InvalidArgument"), body


async def test_an_abort_the_broker_hears_of_while_a_commit_waits_refuses_it(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker's header is OPEN as the commit arrives (the watch's ABORTED is parked on
    purpose): once the watch tells, the commit is refused as END_TXN would be, not
    answered "not here" (found in CI: a commit asked right after the abort on etcd)."""
    await _setup(client)
    service = cluster.broker.service
    headers = service.headers
    txn = await client.transaction().start()
    await wait_until(lambda: headers.cached(txn.id) is not None, what="the watch saw it open")
    parked: list[Any] = []
    deliver = headers._on_event

    def park_its_abort(event: Any) -> None:
        if T.txn_of_header_key(event.key) == txn.id:
            parked.append(event)
        else:
            deliver(event)

    monkeypatch.setattr(headers, "_on_event", park_its_abort)
    await txn.abort()
    await wait_until(lambda: bool(parked), what="the watch reported the abort")
    asked = asyncio.ensure_future(_commit(cluster, txn.id, ["x"]))
    await wait_until(
        lambda: txn.id in service.op_records._commits._pending, what="the commit waits"
    )
    deliver(parked[0])
    assert (await asked)[0] == 409
    assert (await asked)[1]["error"] == "InvalidTxnStatus"


async def test_a_commit_waiting_for_operations_is_refused_when_its_transaction_is_aborted(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One of the two sends a commit names arrived: the abort's header change, not the
    commit's wait (made far longer here), answers it, as END_TXN would."""
    monkeypatch.setattr(commits, "COMMIT_WAIT_S", 600.0)
    _consumer, _message, out = await _setup(client)
    txn = await client.transaction().start()
    seq = _next_seq(out)
    await out.send(b"out", txn=txn)
    asked = asyncio.ensure_future(_commit(cluster, txn.id, _names(out, [seq, seq + 1], None)))
    await wait_until(lambda: txn.id in cluster.broker.service.op_records._commits._pending)
    await txn.abort()
    status, answer = await asyncio.wait_for(asked, 10)
    assert (status, answer["error"]) == (409, "InvalidTxnStatus")


async def test_a_commit_whose_step_is_in_flight_is_never_answered_not_here_at_a_stop() -> None:
    """Stopping with a commit's step in flight: it may land, so its answer is "unknown"
    (the client then asks the coordinator), never "not here" (the client would abort)."""
    header = T.TxnHeader(TxnState.OPEN, 2**50, 0)  # (its timeout far off)
    state = commits.Commits(None)
    waiting = state.ask(TxnId(2**48, 1), 1, 7, header=header, version=3, trace=None)
    writing = state.ask(
        TxnId(2**48, 2), 1, txnops.digest(["op"]), header=header, version=3, trace=None
    )
    state.count(TxnId(2**48, 2), ["op"])
    assert state.due(TxnId(2**48, 2)) is writing
    state.close()
    assert not (await waiting.answer).committed
    with pytest.raises(commits.CommitUnknown):
        await writing.answer


# ---------------------------------------------------------------------- through the client


async def test_the_client_commits_a_transaction_at_its_only_broker(
    client: Client, cluster: Cluster
) -> None:
    """Consume-transform-produce with every operation on one broker: the client's commit
    is the broker's, in the step of the last op records (no END_TXN, one store step)."""
    consumer, message, out = await _setup(client)
    txn = client.transaction()
    await txn.start()
    header_writes = cluster.faults.count("txn", key_prefix=T.header_key(txn.id))
    record_writes = cluster.faults.count("txn", key_prefix=T.ops_prefix(txn.id))
    sent = [await out.send_async(v, txn=txn) for v in (b"a", b"b")]
    acked = await consumer.acknowledge_async(message, txn=txn)
    await txn.commit()
    assert txn.committed_by == "broker"
    assert all(f.done() and not f.exception() for f in sent)
    assert acked.done() and not acked.exception()
    assert (header_writes.calls, record_writes.calls) == (1, 1)
    assert cluster.coordinator.coordinator.counters["committed"] == 0
    assert (await _header(cluster, txn.id)).state is TxnState.COMMITTED
    assert await _read_out(client, 3) == [b"warm-up", b"a", b"b"]
    await consumer.close()
    again = await client.subscribe(TOPIC, "s", initial_position="earliest")
    await (await client.create_producer(TOPIC)).send(b"next")
    assert (await again.receive(timeout_s=10)).value == b"next"  # "in" stays consumed


async def test_a_transaction_spanning_two_brokers_ends_at_its_coordinator(
    client: Client, cluster: Cluster
) -> None:
    """Its operations placed on two brokers (as seen by the client): the coordinator ends
    it, as without the one-step commit."""
    consumer, message, out = await _setup(client)
    async with client.transaction() as txn:
        await out.send(b"out", txn=txn)
        await consumer.acknowledge(message, txn=txn)
        assert txn._placements is not None
        txn._placements.placed(asyncio.get_running_loop().create_future(), "http://b2", "op")
    assert txn.committed_by == "coordinator"
    assert cluster.coordinator.coordinator.counters["committed"] == 1
    assert await _read_out(client, 2) == [b"warm-up", b"out"]


async def test_a_refused_operation_makes_the_commit_not_here_at_once(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ack refused (the message is held by another open transaction): the commit that
    names it is answered at once, not after the wait for operations still to come."""
    monkeypatch.setattr(commits, "COMMIT_WAIT_S", 60.0)
    consumer, message, out = await _setup(client)
    holder = await client.transaction().start()
    await consumer.acknowledge(message, txn=holder)
    txn = await client.transaction().start()
    seq = _next_seq(out)
    await out.send(b"out", txn=txn)
    asked = asyncio.ensure_future(_commit(cluster, txn.id, _names(out, [seq], message)))
    await wait_until(lambda: txn.id in cluster.broker.service.op_records._commits._pending)
    refused = await consumer.acknowledge_async(message, txn=txn)
    with pytest.raises(Exception, match="acknowledged by transaction"):
        await refused
    status, answer = await asyncio.wait_for(asked, 10)
    assert (status, answer["state"]) == (200, "OPEN")
    assert "could not be recorded here" in answer["reason"]
    await holder.abort()


async def test_a_refusal_before_anything_of_its_transaction_is_recorded_is_remembered(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transaction's only operation here is refused, before anything of it is counted:
    a commit asked after it is still answered at once."""
    monkeypatch.setattr(commits, "COMMIT_WAIT_S", 60.0)
    consumer, message, out = await _setup(client)
    holder = await client.transaction().start()
    await consumer.acknowledge(message, txn=holder)
    txn = await client.transaction().start()
    with pytest.raises(Exception, match="acknowledged by transaction"):
        await consumer.acknowledge(message, txn=txn)
    status, answer = await asyncio.wait_for(_commit(cluster, txn.id, _names(out, [], message)), 10)
    assert (status, answer["state"]) == (200, "OPEN")
    assert "acknowledged by transaction" in answer["reason"]
    await holder.abort()


def test_refusals_of_transactions_nothing_follows_are_bounded() -> None:
    state = commits.Commits(None)
    for least in range(commits.RECENT_REFUSALS + 10):
        state.refused(TxnId(2**48, least), "refused")
    assert len(state._refusals) == commits.RECENT_REFUSALS
    assert TxnId(2**48, 0) not in state._refusals
    assert TxnId(2**48, commits.RECENT_REFUSALS + 9) in state._refusals
