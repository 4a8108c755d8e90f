"""The one-step commit at its edges (found in a review of the broker's side): what a commit
leaves behind in the header cache, in both header-watch modes; a store failure while a
commit frame is decided; an operation that completes a commit without a write of its own;
a commit whose transaction's timeout passes while it waits; and a step whose fate is
unknown while someone else's END_TXN commits the header.

The scenarios are made on purpose, as in tests/txn/test_one_step_commit.py, whose openings
these share."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import msgspec
import pytest

from segtxn.broker.txn import commits
from segtxn.broker.txn.headers import HeaderWatch
from segtxn.client import Client
from segtxn.metastore import Op, StoreFull, StoreUnavailable
from segtxn.protocol import frames
from segtxn.protocol.frames import Commit, CommitAnswer, Error
from segtxn.protocol.names import TopicName
from segtxn.protocol.txn import TxnId, TxnState
from segtxn.topics import transactions as T
from tests.cluster import Cluster
from tests.txn.test_one_step_commit import (
    OUT_SEGMENT,
    _commit,
    _names,
    _next_seq,
    _one_send,
    _read_out,
    _setup,
)
from tests.waiting import wait_until


@pytest.mark.parametrize("header_watch", [HeaderWatch.PREFIX, HeaderWatch.SCOPED])
async def test_a_commit_leaves_no_header_behind(
    client: Client, cluster: Cluster, header_watch: HeaderWatch
) -> None:
    """Asked again once committed, or of a transaction that does not exist: the header it
    read is not kept (each one kept was a broker's memory anyone could grow)."""
    headers = cluster.broker.service.headers
    txn, names = await _one_send(client)
    assert (await _commit(cluster, txn.id, names))[1] == {"state": "COMMITTED"}
    await wait_until(lambda: txn.id not in headers._entries, what="the outcome dropped it")
    assert (await _commit(cluster, txn.id, names))[1] == {"state": "COMMITTED"}
    missing = TxnId(txn.id.most, txn.id.least + 1000)
    assert (await _commit(cluster, missing, ["x"]))[0] == 404
    assert txn.id not in headers._entries
    assert missing not in headers._entries
    assert headers.point_watches == 0


@pytest.mark.parametrize("header_watch", [HeaderWatch.PREFIX, HeaderWatch.SCOPED])
async def test_a_refusal_while_a_commit_waits_is_dropped_with_its_transaction(
    client: Client, cluster: Cluster, header_watch: HeaderWatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The only operation of a waiting commit is refused before anything of it is counted:
    what the broker keeps for it goes when the transaction ends, in scoped mode too (where
    only a header somebody listens to is watched)."""
    monkeypatch.setattr(commits, "COMMIT_WAIT_S", 60.0)
    consumer, message, out = await _setup(client)
    holder = await client.transaction().start()
    await consumer.acknowledge(message, txn=holder)
    txn = await client.transaction().start()
    state = cluster.broker.service.op_records._commits
    asked = asyncio.ensure_future(_commit(cluster, txn.id, _names(out, [], message)))
    await wait_until(lambda: txn.id in state._pending, what="the commit waits")
    with pytest.raises(Exception, match="acknowledged by transaction"):
        await consumer.acknowledge(message, txn=txn)
    assert (await asyncio.wait_for(asked, 10))[1]["state"] == "OPEN"
    await txn.abort()
    await holder.abort()
    await wait_until(lambda: txn.id not in state._counted, what="its counts dropped")
    assert txn.id not in cluster.broker.service.headers._listeners


async def test_a_commit_frame_is_answered_when_the_store_fails(
    client: Client, cluster: Cluster
) -> None:
    """The header's read fails: the frame is answered ServiceNotReady (the client then asks
    the coordinator), as the request is with a 503, not left unanswered."""
    await _setup(client)
    txn = await client.transaction().start()
    other = TxnId(txn.id.most, txn.id.least + 1000)  # not cached: read
    cluster.faults.fail("range", key_prefix=T.header_key(other))
    path = "/ws/v2/producer/" + TopicName.parse(OUT_SEGMENT).path
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(cluster.url + path, params={"name": "raw"}) as ws,
    ):
        await ws.receive()  # producer_ready
        commit = Commit(request_id=9, txn=(other.most, other.least), ops=1, digest=1)
        await ws.send_bytes(frames.encode(commit))
        async with asyncio.timeout(10):
            while True:
                got = frames.server_frame.decode((await ws.receive()).data)
                if isinstance(got, CommitAnswer | Error) and got.request_id == 9:
                    break
    assert isinstance(got, Error)
    assert got.error == "ServiceNotReady"


async def test_a_commit_completed_by_a_covered_operation_is_carried(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last operation a commit names is covered by a record that landed already (no
    write to start a step): a step of its own carries the commit, not its wait's end."""
    monkeypatch.setattr(commits, "COMMIT_WAIT_S", 60.0)
    txn, names = await _one_send(client, acked=False)
    writer = cluster.broker.service.op_records
    asked = asyncio.ensure_future(_commit(cluster, txn.id, names))
    await wait_until(lambda: txn.id in writer._commits._pending, what="the commit waits")
    writer.covered(txn.id, [names[1]])  # (stands for an op a landed record covers)
    _, answer = await asyncio.wait_for(asked, 10)
    assert answer == {"state": "COMMITTED"}


async def test_no_commit_lands_past_the_transactions_timeout(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit asked before the timeout, whose last operation arrives after it, is not
    committed here (END_TXN would be refused then), even while the coordinator has not
    aborted the transaction yet (its sweep is held here, as a fail-over would)."""
    monkeypatch.setattr(commits, "COMMIT_WAIT_S", 60.0)

    async def no_sweep(now_ms: int | None = None) -> int:
        return 0

    monkeypatch.setattr(cluster.coordinator.coordinator, "sweep_timeouts", no_sweep)
    _consumer, _message, out = await _setup(client)
    txn = await client.transaction(timeout_s=1).start()
    seq = _next_seq(out)
    await out.send(b"a", txn=txn)
    header = cluster.broker.service.headers.cached(txn.id)
    assert header is not None
    asked = asyncio.ensure_future(_commit(cluster, txn.id, _names(out, [seq, seq + 1], None)))
    await wait_until(lambda: txn.id in cluster.broker.service.op_records._commits._pending)
    await wait_until(lambda: time.time() * 1000 > header.timeout_ms + 200, what="timed out")
    late = await out.send_async(b"b", txn=txn)
    status, answer = await asyncio.wait_for(asked, 10)
    await asyncio.gather(late, return_exceptions=True)
    assert (status, answer["state"]) == (200, "OPEN")
    assert "timeout" in answer["reason"] or "in time" in answer["reason"]


async def test_a_full_store_refuses_the_commit_at_once_and_decides_nothing(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step carrying the commit is refused by a full store (it did not apply): the
    commit is "not here" at once, the header stays OPEN, and the send is refused, instead
    of a settling that a full store refuses alike until an operator acts."""
    monkeypatch.setattr(commits, "COMMIT_WAIT_S", 60.0)
    _consumer, _message, out = await _setup(client)
    txn = await client.transaction().start()
    names = _names(out, [_next_seq(out)], None)
    asked = asyncio.ensure_future(_commit(cluster, txn.id, names))
    await wait_until(lambda: txn.id in cluster.broker.service.op_records._commits._pending)
    full = StoreFull("injected: database space exceeded")
    cluster.faults.fail("txn", key_prefix=T.header_key(txn.id), error=full, times=None)
    sent = await out.send_async(b"out", txn=txn)
    status, answer = await asyncio.wait_for(asked, 10)
    assert (status, answer["state"]) == (200, "OPEN")
    assert "store is full" in answer["reason"]
    with pytest.raises(Exception, match="store is full"):
        await asyncio.wait_for(sent, 10)
    cluster.faults.clear()
    record = await cluster.store.get(T.header_key(txn.id))
    assert record is not None
    assert T.decode_header(record.value).state is TxnState.OPEN
    await txn.abort()


async def test_a_commit_by_someone_else_does_not_settle_the_step_as_landed(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step carrying the commit fails with an unknown outcome (it did not apply), and by
    the time the broker reads the header, an END_TXN sent while the send was in flight has
    committed it. That COMMITTED is not the step's: the send's record is in no transaction,
    so the send fails and the commit is not answered COMMITTED (it was: a success for a send
    that the committed transaction does not hold)."""
    monkeypatch.setattr(commits, "COMMIT_WAIT_S", 60.0)
    _consumer, _message, out = await _setup(client)
    txn = await client.transaction().start()
    names = _names(out, [_next_seq(out)], None)
    asked = asyncio.ensure_future(_commit(cluster, txn.id, names))
    writer = cluster.broker.service.op_records
    await wait_until(lambda: txn.id in writer._commits._pending)
    store = writer._store
    step = store.commit

    async def committed_elsewhere_then_lost(ops: list[Op]) -> object:
        if any(getattr(op, "key", None) == T.header_key(txn.id) for op in ops):
            monkeypatch.setattr(store, "commit", step)
            record = await cluster.store.get(T.header_key(txn.id))
            assert record is not None
            header = T.decode_header(record.value)
            ended = msgspec.structs.replace(
                header, state=TxnState.COMMITTED, finalized_ms=header.created_ms
            )
            await cluster.store.put(
                T.header_key(txn.id),
                T.encode(ended),
                expected_version=record.version,
                partition_key=txn.id.key,
                indexes=T.header_indexes(ended),
            )
            raise StoreUnavailable("injected: the step's answer was lost")
        return await step(ops)

    monkeypatch.setattr(store, "commit", committed_elsewhere_then_lost)
    sent = await out.send_async(b"out", txn=txn)
    status, answer = await asyncio.wait_for(asked, 10)
    assert (status, answer["state"]) == (200, "OPEN")
    with pytest.raises(Exception, match="could not record"):
        await asyncio.wait_for(sent, 10)
    assert (await cluster.store.list_prefix(T.ops_prefix(txn.id))).records == []
    later = await client.transaction().start()
    await out.send(b"after", txn=later)
    await later.commit()
    assert await _read_out(client, 2) == [b"warm-up", b"after"]  # the entry is an orphan
