"""The coordinators' background loops other than the sweeps go on after an error they did
not expect (tests/coordinator/test_v4_sweep_edges.py has the sweeps):

- v4 ``HeldLogs._hold``: a take-over of an id whose recovery raised once is tried again,
  and the id serves; so is one whose resignation after a failed recovery raised too;
  take-overs whose resignations failed in a row (the store away) keep one leadership
  guard, not one each;
- v4 ``_resume``: finishing a timed-out transaction that raised once is tried again, and it
  ends ABORTED;
- v5 ``HeldIds._hold``: a campaign that raised once is run again, and the id is held;
- v5 ``HeldIds._keep_registered``: a registration after the session expired that raised
  once is tried again, and the ids are held again; one that failed half way leaves no
  session behind.

Each loop caught only the errors it expected (the store's, the ledger's, or only
``ServerError``); anything else ended its task silently (asyncio's "Task exception was never
retrieved", at best) and nothing started it again: the coordinator stopped holding an id
(a v4 id it had won stayed its own, so nobody else could take it), left a transaction
TIME_OUT for ever, or never registered again after an outage. Real coordinators on a
memory store (v4: its log in files); the failure is injected once into a collaborator."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from segtxn.coordinator import v5ids
from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.coordinator.txnlog import ABORTED, TIME_OUT, log_name
from segtxn.coordinator.v4 import CoordinatorV4
from segtxn.coordinator.v4held import HeldLog
from segtxn.coordinator.v4ids import ELECTION_PREFIX
from segtxn.coordinator.v5 import CoordinatorV5
from segtxn.ledger import LedgerSettings
from segtxn.ledger.metadata import metadata_key
from segtxn.metastore import LeaderElection, Leadership, MetadataStore, open_store
from segtxn.metastore.election import ELECTIONS_PREFIX
from segtxn.metastore.faults import FaultInjector
from segtxn.protocol.errors import ServerError
from segtxn.topics import transactions as T
from tests.coordinator.failing import FAILURES, FailsOnce
from tests.waiting import wait_until

SWEEP_S = 0.05
UNEXPECTED = ["server", "bug", "damage"]
"""What the v4 take-over and the v5 loops did not expect (they caught store and ledger
errors; ``server`` is ServiceNotReady)."""


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    async with open_store("memory://", wrap=FaultInjector) as s:
        yield s


def faults_of(store: MetadataStore) -> FaultInjector:
    engine = store.engine
    assert isinstance(engine, FaultInjector)
    return engine


def v4_settings(tmp_path: Path) -> CoordinatorSettings:
    return CoordinatorSettings(
        advertise_url="http://127.0.0.1:1",
        v4_coordinator_ids=1,
        ledger_url=f"file://{tmp_path / 'txn-logs'}",
        timeout_sweep_s=SWEEP_S,
    )


def v5_settings() -> CoordinatorSettings:
    return CoordinatorSettings(
        advertise_url="http://127.0.0.1:1", coordinator_ids=1, session_ttl_s=2,
        timeout_sweep_s=3600, gc_sweep_s=3600, id_block=100,
    )  # fmt: skip


# ------------------------------------------------------------------------------ v4


@pytest.mark.parametrize("failure", UNEXPECTED)
async def test_a_v4_take_over_that_raised_is_tried_again(
    store: MetadataStore, tmp_path: Path, failure: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The recovery of id 0's log raises once (its replay met a damaged record, a bug):
    the coordinator lets the id go and takes it over again, and the id serves."""
    v4 = CoordinatorV4(store, v4_settings(tmp_path))
    recover = FailsOnce(v4.ids, "_recover", FAILURES[failure](), lambda *_: True)
    await v4.start()
    try:
        await asyncio.wait_for(recover.failed.wait(), 10)
        await wait_until(lambda: 0 in v4.held, what="v4 id 0 held after a failed take-over")
        txn, _ = await v4.new_txn(timeout_s=60)
        assert txn.most == 0
    finally:
        await v4.stop()
    assert "injected" in caplog.text  # the failed take-over was logged


@pytest.mark.parametrize("failure", UNEXPECTED)
async def test_a_v4_take_over_whose_resignation_raised_is_tried_again(
    store: MetadataStore,
    tmp_path: Path,
    failure: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The recovery of id 0's log raises once, and so does letting the id go after it
    (the resignation): the failure is logged (at ERROR with its traceback unless it is
    one the loops expect), the coordinator
    campaigns again, and the id serves. Only a store error was caught there: any other
    one ended the loop, the id won by its session and never served, and nobody else could
    take it."""
    failed = asyncio.Event()
    resign = Leadership.resign

    async def fails_once(leadership: Leadership) -> None:
        if not failed.is_set():
            failed.set()
            raise FAILURES[failure]()
        await resign(leadership)

    monkeypatch.setattr(Leadership, "resign", fails_once)
    v4 = CoordinatorV4(store, v4_settings(tmp_path))
    recover = FailsOnce(v4.ids, "_recover", RuntimeError("injected: recovery"), lambda *_: True)
    await v4.start()
    try:
        await asyncio.wait_for(recover.failed.wait(), 10)
        await asyncio.wait_for(failed.wait(), 10)
        await wait_until(lambda: 0 in v4.held, what="v4 id 0 held after a failed resignation")
        txn, _ = await v4.new_txn(timeout_s=60)
        assert txn.most == 0
    finally:
        await v4.stop()
    (record,) = [r for r in caplog.records if str(FAILURES[failure]()) in r.getMessage()]
    if failure == "server":  # (an expected error: WARNING, as retry.log_failure does)
        assert record.levelname == "WARNING" and not record.exc_info, record
    else:
        assert record.levelname == "ERROR" and record.exc_info is not None, record


CYCLES = 3
"""Failed take-overs whose resignation failed too, in a row (a second apart: the pace of
the take-over's retries)."""


async def test_failed_take_overs_whose_resignation_failed_keep_one_guard(
    store: MetadataStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """During an outage the store refuses id 0's log record (its recovery fails) and the
    delete of the election key (the resignation after it fails): take-over after take-over,
    the id keeps one leadership, watched by one guard, and once the store is back it serves
    with one guard still. Each campaign retook the key its session still held with a guard
    of its own, and the earlier guards (each a task and a store watch) ran on for good:
    one more per failed take-over while the store was away."""
    faults = faults_of(store)
    election_key = ELECTIONS_PREFIX + ELECTION_PREFIX + "0"

    def guards() -> int:
        """The running guards of a leadership (Leadership._guard tasks)."""
        return sum(
            getattr(t.get_coro(), "__qualname__", "") == "Leadership._guard" and not t.done()
            for t in asyncio.all_tasks()
        )

    v4 = CoordinatorV4(store, v4_settings(tmp_path))
    seen: list[int] = []
    """The guards running as each take-over begins."""
    recover = v4.ids._recover

    async def recover_in_outage(coordinator_id: int, leadership: Leadership) -> HeldLog:
        seen.append(guards())
        if len(seen) > CYCLES:
            faults.clear()  # the store is back
        else:  # the resignation after this failed recovery: its delete refused
            faults.fail("txn", key_prefix=election_key, times=1)
        return await recover(coordinator_id, leadership)

    monkeypatch.setattr(v4.ids, "_recover", recover_in_outage)
    for operation in ("range", "txn"):  # id 0's log record is out of reach
        faults.fail(operation, key_prefix=metadata_key(log_name(0)), times=None)
    await v4.start()
    try:
        await wait_until(lambda: 0 in v4.held, timeout=20, what="v4 id 0 held after the outage")
        assert len(seen) == CYCLES + 1
        assert seen == [1] * len(seen), f"guards at each take-over: {seen}"
        assert guards() == 1
        await wait_until(lambda: faults.open_watches == 1, what="one watch: the guard's")
        txn, _ = await v4.new_txn(timeout_s=60)
        assert txn.most == 0
    finally:
        await v4.stop()
    assert guards() == 0


@pytest.mark.parametrize("failure", ["store", "bug"])
async def test_finishing_a_v4_transaction_that_raised_is_tried_again(
    store: MetadataStore, tmp_path: Path, failure: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The abort of a timed-out transaction raises once (a store error out of the
    fan-out's look-ups, a bug): it is tried again, and the transaction ends ABORTED. It
    stayed TIME_OUT (its participants' pending entries with it) until a take-over."""
    v4 = CoordinatorV4(store, v4_settings(tmp_path))
    await v4.start()
    try:
        await wait_until(lambda: 0 in v4.held, what="v4 id 0 held")
        finish = FailsOnce(
            v4, "_finish", FAILURES[failure](), lambda _, meta, __: meta.state == TIME_OUT
        )
        txn, _ = await v4.new_txn(timeout_s=0.1)
        await asyncio.wait_for(finish.failed.wait(), 10)
        await wait_until(lambda: v4.status(txn).state == ABORTED, what=f"{txn} aborted")
    finally:
        await v4.stop()
    assert "injected" in caplog.text


@pytest.mark.parametrize("failure", UNEXPECTED)
async def test_giving_up_a_v4_id_whose_log_failed_goes_on_after_an_error(
    store: MetadataStore, tmp_path: Path, failure: str
) -> None:
    """A log write fails, so the id is given up (a take-over reopens the log); the first
    resignation raises: it is tried again, and the id serves after the take-over. The id
    stayed here, its log refusing every write, for good."""
    settings = dataclasses.replace(
        v4_settings(tmp_path),
        ledger=LedgerSettings(max_ledger_bytes=1),  # every append after the first rolls over
        timeout_sweep_s=3600,
    )
    v4 = CoordinatorV4(store, settings)
    await v4.start()
    try:
        await wait_until(lambda: 0 in v4.held, what="v4 id 0 held")
        await v4.new_txn(timeout_s=60)  # the first entry of the ledger
        resign = FailsOnce(v4.held[0].leadership, "resign", FAILURES[failure](), lambda: True)
        faults_of(store).fail("txn", key_prefix=metadata_key(log_name(0)), times=1)
        with pytest.raises(ServerError):
            await v4.new_txn(timeout_s=60)  # the log's write fails: the id is given up
        await asyncio.wait_for(resign.failed.wait(), 10)

        async def serves() -> bool:
            try:
                await v4.new_txn(timeout_s=60)
            except ServerError:
                return False
            return True

        await wait_until(serves, what="v4 id 0 serving again after its take-over")
    finally:
        await v4.stop()


# ------------------------------------------------------------------------------ v5


@pytest.mark.parametrize("failure", UNEXPECTED)
async def test_a_v5_campaign_that_raised_is_run_again(
    store: MetadataStore, failure: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first campaign for the id raises: the coordinator campaigns again and holds
    it (it held nothing, and said not ready, for ever)."""
    failed = asyncio.Event()

    class FailsOnceElection(LeaderElection):
        async def campaign(self) -> Leadership:
            if not failed.is_set():
                failed.set()
                raise FAILURES[failure]()
            return await super().campaign()

    monkeypatch.setattr(v5ids, "LeaderElection", FailsOnceElection)
    coordinator = CoordinatorV5(store, v5_settings())
    await coordinator.start()
    try:
        await asyncio.wait_for(failed.wait(), 10)
        await wait_until(lambda: len(coordinator.held) == 1, what="the v5 id held")
    finally:
        await coordinator.stop()


@pytest.mark.parametrize("failure", UNEXPECTED)
async def test_a_v5_registration_that_raised_is_tried_again(
    store: MetadataStore, failure: str
) -> None:
    """The session expires, and opening the next one raises once: the coordinator
    registers again and holds its id (it never registered again: no id, for good)."""
    coordinator = CoordinatorV5(store, v5_settings())
    await coordinator.start()
    try:
        await wait_until(lambda: len(coordinator.held) == 1, what="the v5 id held")
        first = coordinator.ids.session
        opening = FailsOnce(store, "open_session", FAILURES[failure](), lambda *_: True)
        assert await faults_of(store).expire_sessions() == 1
        await asyncio.wait_for(opening.failed.wait(), 10)
        await wait_until(
            lambda: len(coordinator.held) == 1 and coordinator.ids.session is not first,
            what="the v5 id held again on a new session",
        )
    finally:
        await coordinator.stop()


async def test_a_registration_that_failed_half_way_leaves_no_session(
    store: MetadataStore,
) -> None:
    """After the session expired, the member record's write fails once: the session
    opened for it is closed before the next try. It was left open, kept alive for
    nothing: one more lease (and keep-alive task) per failed try while the store refused
    the write."""
    faults = faults_of(store)
    coordinator = CoordinatorV5(store, v5_settings())
    await coordinator.start()
    try:
        await wait_until(lambda: len(coordinator.held) == 1, what="the v5 id held")
        first = coordinator.ids.session
        grants, revokes = faults.count("lease_grant"), faults.count("lease_revoke")
        faults.fail("txn", key_prefix=T.COORDINATOR_MEMBERS, times=1)
        injected = faults.injected
        assert await faults.expire_sessions() == 1
        await wait_until(
            lambda: len(coordinator.held) == 1 and coordinator.ids.session is not first,
            what="the v5 id held again on a new session",
        )
        assert faults.injected - injected == 2  # the expiry, and the failed write
    finally:
        await coordinator.stop()
    assert (grants.calls, revokes.calls) == (2, 2)  # each session opened was closed
