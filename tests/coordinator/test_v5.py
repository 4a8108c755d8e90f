"""The v5 coordinator: ids held by leases, END_TXN as one CAS, sweeps, take-over."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.coordinator.v5 import CoordinatorV5
from segtxn.metastore import MetadataStore, open_store
from segtxn.metastore.faults import FaultInjector
from segtxn.metastore.memory import MemoryEngine
from segtxn.metastore.settings import StoreSettings
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.txn import V5_COORDINATOR_BASE, TxnAction, TxnId, TxnState
from segtxn.topics import transactions as T
from tests.waiting import wait_until

SETTINGS = CoordinatorSettings(
    advertise_url="http://127.0.0.1:1", coordinator_ids=2, session_ttl_s=1,
    timeout_sweep_s=3600, gc_sweep_s=3600, gc_retention_s=0, id_block=3,
)  # fmt: skip


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    async with open_store("memory://") as s:
        yield s


@pytest.fixture
async def coordinator(store: MetadataStore) -> AsyncIterator[CoordinatorV5]:
    c = CoordinatorV5(store, SETTINGS)
    await c.start()
    await wait_until(lambda: len(c.held) == 2, what="both ids held")
    yield c
    await c.stop()


async def test_new_txn_writes_an_open_header_indexed_by_deadline(
    coordinator: CoordinatorV5, store: MetadataStore
) -> None:
    txn, header = await coordinator.new_txn(timeout_s=30)
    assert txn.is_v5 and txn.most >= V5_COORDINATOR_BASE
    record = await store.get(T.header_key(txn))
    assert record is not None and T.decode_header(record.value) == header
    assert header.state is TxnState.OPEN and header.timeout_ms - header.created_ms == 30_000
    due = await store.index_range(T.IDX_DEADLINE, header.timeout_ms, header.timeout_ms + 1)
    assert [e.key for e in due.entries] == [T.header_key(txn)]
    ids = {(await coordinator.new_txn())[0] for _ in range(10)}  # across blocks of 3
    assert len(ids) == 10 and txn not in ids


async def test_end_txn_is_one_cas_and_idempotent(
    coordinator: CoordinatorV5, store: MetadataStore
) -> None:
    txn, _ = await coordinator.new_txn()
    committed = await coordinator.end_txn(txn, TxnAction.COMMIT)
    assert committed.state is TxnState.COMMITTED and committed.finalized_ms is not None
    again = await coordinator.end_txn(txn, TxnAction.COMMIT)
    assert again == committed  # the same decision again: success, nothing written
    with pytest.raises(ServerError) as opposite:
        await coordinator.end_txn(txn, TxnAction.ABORT)
    assert opposite.value.name is ErrorName.INVALID_TXN_STATUS
    assert (await store.index_range(T.IDX_DEADLINE)).entries == []
    final = await store.index_range(T.IDX_FINAL, (TxnState.COMMITTED.value,))
    assert [e.key for e in final.entries] == [T.header_key(txn)]
    assert coordinator.counters["header_cas_ok"] == 1
    assert coordinator.counters["header_cas_reject"] == 1


async def test_end_txn_of_a_transaction_created_here_needs_no_read() -> None:
    async with open_store("memory://", wrap=FaultInjector) as store:
        coordinator = CoordinatorV5(store, SETTINGS)
        await coordinator.start()
        try:
            await wait_until(lambda: len(coordinator.held) == 2, what="both ids held")
            txn, _ = await coordinator.new_txn()
            engine = store._engine()
            assert isinstance(engine, FaultInjector)
            reads = engine.count("range", key_prefix=T.header_key(txn))
            assert (await coordinator.end_txn(txn, TxnAction.COMMIT)).state is TxnState.COMMITTED
            assert reads.calls == 0 and coordinator.counters["header_cas_ok"] == 1
        finally:
            await coordinator.stop()


async def test_end_txn_after_someone_else_decided_reads_the_header(
    coordinator: CoordinatorV5, store: MetadataStore
) -> None:
    """What this process remembers of a header it created may be stale (another
    coordinator's timeout sweep aborted it): the CAS fails and the read tells the truth."""
    txn, header = await coordinator.new_txn()
    record = await store.get(T.header_key(txn))
    assert record is not None
    aborted = T.TxnHeader(TxnState.ABORTED, header.timeout_ms, header.created_ms, 1)
    await store.put(
        T.header_key(txn),
        T.encode(aborted),
        expected_version=record.version,
        indexes=T.header_indexes(aborted),
    )
    with pytest.raises(ServerError) as refused:
        await coordinator.end_txn(txn, TxnAction.COMMIT)
    assert refused.value.name is ErrorName.INVALID_TXN_STATUS
    assert coordinator.counters["header_cas_conflict"] == 1


async def test_concurrent_commit_and_abort_have_one_winner(coordinator: CoordinatorV5) -> None:
    for _ in range(20):
        txn, _ = await coordinator.new_txn()
        results = await asyncio.gather(
            coordinator.end_txn(txn, TxnAction.COMMIT),
            coordinator.end_txn(txn, TxnAction.ABORT),
            return_exceptions=True,
        )
        winners = [r for r in results if not isinstance(r, BaseException)]
        losers = [r for r in results if isinstance(r, ServerError)]
        assert len(winners) == 1 and len(losers) == 1
        assert losers[0].name is ErrorName.INVALID_TXN_STATUS
        assert (await coordinator.status(txn)).state is winners[0].state


async def test_unknown_and_v4_transactions(coordinator: CoordinatorV5) -> None:
    with pytest.raises(ServerError) as unknown:
        await coordinator.end_txn(TxnId(V5_COORDINATOR_BASE, 999_999), TxnAction.COMMIT)
    assert unknown.value.name is ErrorName.TRANSACTION_NOT_FOUND
    with pytest.raises(ServerError) as v4:
        await coordinator.end_txn(TxnId(3, 1), TxnAction.COMMIT)
    assert v4.value.name is ErrorName.NOT_ALLOWED
    txn, _ = await coordinator.new_txn()
    coordinator.add_participants(txn, ["topic://t/n/x", "segment://t/n/x/1"])
    with pytest.raises(ServerError) as mixed:
        coordinator.add_participants(txn, ["persistent://t/n/old"])
    assert mixed.value.name is ErrorName.NOT_ALLOWED and "v4" in mixed.value.message
    with pytest.raises(ServerError) as timeout:
        await coordinator.new_txn(timeout_s=0)
    assert timeout.value.name is ErrorName.INVALID_ARGUMENT


async def test_timeout_sweep_aborts_and_late_commit_fails(
    coordinator: CoordinatorV5, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="segtxn")
    txn, header = await coordinator.new_txn(timeout_s=10)
    assert await coordinator.sweep_timeouts(now_ms=header.timeout_ms - 1) == 0
    assert not info_lines(caplog, "timed out")
    assert await coordinator.sweep_timeouts(now_ms=header.timeout_ms + 1) == 1
    assert (await coordinator.status(txn)).state is TxnState.ABORTED
    with pytest.raises(ServerError) as late:
        await coordinator.end_txn(txn, TxnAction.COMMIT)
    assert late.value.name is ErrorName.INVALID_TXN_STATUS
    # The operator sees both: the sweep's abort (id, age, timeout), then the refused commit,
    # each naming the transaction as the client prints it.
    assert info_lines(caplog, "timed out") == [
        f"txn {txn}: timed out, aborted by the sweep (age 10.0 s, timeout 10.0 s)"
    ]
    [refused] = info_lines(caplog, "refused")
    assert refused.startswith(f"txn {txn}: COMMIT refused, already ABORTED")


def info_lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.INFO and r.name.startswith("segtxn") and text in r.getMessage()
    ]


async def test_commits_and_aborts_log_at_debug_only(
    coordinator: CoordinatorV5, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="segtxn")
    committed, _ = await coordinator.new_txn()
    aborted, _ = await coordinator.new_txn()
    await coordinator.end_txn(committed, TxnAction.COMMIT)
    await coordinator.end_txn(aborted, TxnAction.ABORT)
    mine = [
        r
        for r in caplog.records
        if str(committed) in r.getMessage() or str(aborted) in r.getMessage()
    ]
    assert {r.levelno for r in mine} == {logging.DEBUG}
    assert {r.getMessage() for r in mine} >= {
        f"txn {committed}: COMMITTED",
        f"txn {aborted}: ABORTED",
    }


async def test_gc_waits_for_op_records_then_deletes_the_header(
    coordinator: CoordinatorV5, store: MetadataStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="segtxn")
    txn, _ = await coordinator.new_txn()
    segment = "segment://t/n/x/0"
    op = T.WritesRecord(segment, (1, 0), (1, 0))
    await store.put(T.writes_key(txn, segment), T.encode(op), indexes=T.op_indexes(op))
    await coordinator.end_txn(txn, TxnAction.COMMIT)
    assert await coordinator.sweep_gc() == 0 and coordinator.gc_backlog == 1
    await store.delete_range(T.ops_prefix(txn))  # the participant materialized and cleaned
    assert await coordinator.sweep_gc() == 1 and coordinator.gc_backlog == 0
    assert await store.get(T.header_key(txn)) is None
    assert await coordinator.sweep_gc() == 0  # nothing new: nothing logged
    # One summary per sweep that changed something, never a line per header.
    assert info_lines(caplog, "gc sweep") == [
        "gc sweep: deleted 0 final headers; backlog 1 op records (was 0)",
        "gc sweep: deleted 1 final headers; backlog 0 op records (was 1)",
    ]


async def test_a_standby_takes_over_the_ids_with_no_replay(store: MetadataStore) -> None:
    first = CoordinatorV5(store, SETTINGS)
    await first.start()
    await wait_until(lambda: len(first.held) == 2, what="first holds both ids")
    standby = CoordinatorV5(store, SETTINGS)
    await standby.start()
    txn, _ = await first.new_txn()
    assert not standby.held
    await first.stop()  # its session ends: the standby wins both elections
    await wait_until(lambda: len(standby.held) == 2, what="standby holds both ids")
    assert (await standby.end_txn(txn, TxnAction.COMMIT)).state is TxnState.COMMITTED
    fresh, _ = await standby.new_txn()
    assert fresh != txn and fresh.least > 0  # ids are never reused after a take-over
    await standby.stop()


async def test_a_coordinator_whose_session_expired_registers_and_serves_again() -> None:
    """The store was unreachable for longer than the session's TTL (here: its lease revoked):
    the ids and the member record went with the session. The coordinator registers again with
    a new session and serves; before, it never campaigned again."""
    faults = FaultInjector(MemoryEngine())
    store = MetadataStore(faults, StoreSettings(), owns_engine=True)
    coordinator = CoordinatorV5(store, SETTINGS)
    await coordinator.start()
    try:
        await wait_until(lambda: len(coordinator.held) == 2, what="both ids held")
        first = coordinator.ids.session  # the state under test
        assert first is not None
        assert await faults.expire_sessions() >= 1
        await wait_until(
            lambda: coordinator.ids.session is not first and len(coordinator.held) == 2,
            timeout=10,
            what="both ids held again on a new session",
        )
        _, header = await coordinator.new_txn()
        assert header.state is TxnState.OPEN
        members = await store.list_prefix(T.COORDINATOR_MEMBERS)
        assert [r.value for r in members.records] == [SETTINGS.advertise_url.encode()]
    finally:
        await coordinator.stop()
        await store.close()
