"""A stop's time limit (:mod:`segtxn.stopping`) still bounds a step whose store call does
not answer, now that a ledger's metadata CAS runs to its end (:func:`segtxn.aio.run_to_end`).

``Stopping.step`` bounds each step with ``asyncio.timeout_at``: a step past the stop's time
is cancelled and the stop goes on ("not done within the stop's time; going on without it").
Since 2e6af6a a ledger's metadata change swallows that cancel until the store answers, so a
step closing a ledger whose clean-close write gets no answer never ends, nor does the stop
(nor the CLI's ``--shutdown-timeout``, which cancels the stop the same way).

Real components: the memory store wrapped by the fault injector, whose ``hold`` parks a
write's answer (applied already) until the test lets it go; real files; a real v4
coordinator.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.coordinator.txnlog import log_name
from segtxn.coordinator.v4 import CoordinatorV4
from segtxn.ledger import FileLogStorage, LedgerSettings, ManagedLedger
from segtxn.ledger.cursor import cursors_prefix
from segtxn.ledger.metadata import metadata_key
from segtxn.metastore import MetadataStore
from segtxn.metastore.election import ELECTIONS_PREFIX
from segtxn.metastore.etcd_server import free_port
from segtxn.metastore.faults import FaultInjector
from segtxn.metastore.memory import MemoryEngine
from segtxn.metastore.settings import StoreSettings
from segtxn.stopping import CANCELLED_END_S, LAST_STEP_S, Stopping
from segtxn.topics.transactions import V4_COORDINATOR_ELECTION
from tests.waiting import wait_until

LIMIT_S = 0.2
"""The stop's time in these tests: a held step is abandoned LAST_STEP_S after it at most."""
SLACK_S = 2.0

NAME = "persistent://t/n/held-close"
ELECTION_KEY = ELECTIONS_PREFIX + V4_COORDINATOR_ELECTION + "0"
"""v4 coordinator id 0's election key."""


def memory_store_with_faults() -> tuple[MetadataStore, FaultInjector]:
    faults = FaultInjector(MemoryEngine())
    return MetadataStore(faults, StoreSettings(), owns_engine=True), faults


async def test_a_stop_step_closing_a_ledger_ends_in_the_stops_time_while_the_store_is_silent(
    tmp_path: Path,
) -> None:
    store, faults = memory_store_with_faults()
    ledger = await ManagedLedger.open(
        NAME, store, FileLogStorage(tmp_path / "ledgers"), LedgerSettings()
    )
    await ledger.append(b"m")
    held = faults.hold("txn", key_prefix=metadata_key(NAME))  # the clean close's answer
    stopping = Stopping("a test's stop", limit_s=LIMIT_S)
    step = asyncio.create_task(stopping.step("closing the ledger", ledger.close()))
    try:
        await held.wait_for(1)
        done, _ = await asyncio.wait({step}, timeout=LIMIT_S + LAST_STEP_S + SLACK_S)
        assert step in done, (
            "the stop's step was not abandoned at the stop's time: its cancel waits for a "
            "store answer that never comes (run_to_end)"
        )
    finally:
        held.release()
        faults.clear()
        await asyncio.gather(step, return_exceptions=True)
        await ledger.close()
        await store.close()


async def test_a_v4_coordinators_stop_ends_in_its_time_while_its_logs_record_gets_no_answer(
    tmp_path: Path,
) -> None:
    store, faults = memory_store_with_faults()
    v4 = CoordinatorV4(
        store,
        CoordinatorSettings(
            advertise_url=f"http://127.0.0.1:{free_port()}",
            v4_coordinator_ids=1,
            gc_retention_s=0,
            timeout_sweep_s=3600,
            ledger_url=f"file://{tmp_path / 'txn-logs'}",
        ),
    )
    await v4.start()
    stop: asyncio.Task[None] | None = None
    held = None
    try:
        await wait_until(lambda: 0 in v4.held, what="v4 id 0 held")
        await v4.new_txn(timeout_s=3600)
        # every write to the log's record: its answer parked (the store silent for it)
        held = faults.hold("txn", key_prefix=metadata_key(log_name(0)), times=None)
        stop = asyncio.create_task(v4.stop(Stopping("coordinator", limit_s=LIMIT_S)))
        await held.wait_for(1)  # the log's clean close, applied, its answer parked
        done, _ = await asyncio.wait({stop}, timeout=LIMIT_S + LAST_STEP_S + SLACK_S)
        assert stop in done, (
            "the coordinator's stop did not end within its time limit: closing its log "
            "waits for a store answer that never comes (run_to_end swallows the cancel)"
        )
    finally:
        if held is not None:
            held.release()
        faults.clear()
        if stop is not None:
            await asyncio.gather(stop, return_exceptions=True)
        await v4.stop()
        await store.close()


async def test_a_v4_coordinators_stop_ends_in_its_time_while_a_cancelled_take_over_closes_its_log(
    tmp_path: Path,
) -> None:
    """The stop cancels the coordinator's tasks and waits for them before its steps, out of
    its time limit. A take-over cancelled while it opened its log closes that log (its
    writer must not outlive it), and the close's clean-close write, made once the cancel
    was taken, waited for the store's answer with no cancel left to cut it short: with the
    store silent, the stop never ended. The stop now waits for its tasks a bounded time
    (naming at WARNING those it leaves), and the clean-up's write gets the grace of the
    cancel it unwinds from (:func:`segtxn.aio.run_to_end`)."""
    store, faults = memory_store_with_faults()
    listing = faults.hold("range", key_prefix=cursors_prefix(log_name(0)))  # the open's
    v4 = CoordinatorV4(
        store,
        CoordinatorSettings(
            advertise_url=f"http://127.0.0.1:{free_port()}",
            v4_coordinator_ids=1,
            gc_retention_s=0,
            timeout_sweep_s=3600,
            ledger_url=f"file://{tmp_path / 'txn-logs'}",
        ),
    )
    await v4.start()
    stop: asyncio.Task[None] | None = None
    held = None
    try:
        await listing.wait_for(1)  # the take-over of id 0 is opening its log
        held = faults.hold("txn", key_prefix=metadata_key(log_name(0)), times=None)
        stop = asyncio.create_task(v4.stop(Stopping("coordinator", limit_s=LIMIT_S)))
        done, _ = await asyncio.wait({stop}, timeout=LIMIT_S + CANCELLED_END_S + SLACK_S)
        assert stop in done, (
            "the coordinator's stop did not end within its time limit and the grace: it "
            "waits for a cancelled task that does not end"
        )
        # and the take-over's clean-up ends in the grace of the cancel it took (it had none)
        await wait_until(lambda: not v4._tasks, timeout=CANCELLED_END_S + SLACK_S)
    finally:
        listing.release()
        if held is not None:
            held.release()
        faults.clear()
        if stop is not None:
            await asyncio.gather(stop, return_exceptions=True)
        await v4.stop()
        await store.close()


async def test_a_take_over_whose_cancel_became_a_failure_does_not_win_the_id_after_the_stop(
    tmp_path: Path,
) -> None:
    """A take-over cancelled by the stop while it opened its log closes that log in its
    clean-up; a close that fails (its clean-close write refused) raises its LedgerError in
    place of the cancel. The campaign took it for a failed take-over, let the id go and
    campaigned again, on a new session once the stop had closed its own: after the stop
    had resigned its ids, the stopped coordinator won id 0 again and served it for ever."""
    store, faults = memory_store_with_faults()
    listing = faults.hold("range", key_prefix=cursors_prefix(log_name(0)))  # the open's
    v4 = CoordinatorV4(
        store,
        CoordinatorSettings(
            advertise_url=f"http://127.0.0.1:{free_port()}",
            v4_coordinator_ids=1,
            gc_retention_s=0,
            timeout_sweep_s=3600,
            ledger_url=f"file://{tmp_path / 'txn-logs'}",
        ),
    )
    await v4.start()
    try:
        await listing.wait_for(1)  # the take-over of id 0 is opening its log
        faults.fail("txn", key_prefix=metadata_key(log_name(0)), times=None)  # its close's
        await v4.stop(Stopping("coordinator", limit_s=LIMIT_S))
        faults.clear()  # the store serves again: a campaign still running wins at once
        await wait_until(
            lambda: not v4._tasks,
            timeout=CANCELLED_END_S + SLACK_S,
            what="the take-over's campaign ended",
        )
        assert 0 not in v4.held
        assert await store.get(ELECTION_KEY) is None, "id 0 is held by the stopped coordinator"
    finally:
        listing.release()
        faults.clear()
        await v4.stop()
        await store.close()
