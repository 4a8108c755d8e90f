"""The coordinators' sweeps go on after a failed round: a v4 timeout sweep, a v5 timeout
sweep and a v5 GC sweep whose round raised once (a store or server error, or a bug: a
method the sweep calls is made to fail once) time out and collect the transactions at a
later round. Each loop ended at the first error it did not expect, silently, and
transactions then never timed out (v5: a failed round of either sweep stopped both). Real
coordinators on a memory store (v4: its log in files)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.coordinator.txnlog import ABORTED, TIME_OUT
from segtxn.coordinator.v4 import CoordinatorV4
from segtxn.coordinator.v5 import CoordinatorV5
from segtxn.metastore import MetadataStore, open_store
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.txn import TxnAction
from segtxn.topics import transactions as T
from tests.coordinator.failing import FAILURES, FailsOnce
from tests.waiting import wait_until

SWEEP_S = 0.05


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    async with open_store("memory://") as s:
        yield s


@pytest.fixture
async def v5(store: MetadataStore) -> AsyncIterator[CoordinatorV5]:
    settings = CoordinatorSettings(
        advertise_url="http://127.0.0.1:1", coordinator_ids=1, session_ttl_s=2,
        timeout_sweep_s=SWEEP_S, gc_sweep_s=SWEEP_S, gc_retention_s=0, id_block=100,
    )  # fmt: skip
    coordinator = CoordinatorV5(store, settings)
    await coordinator.start()
    try:
        await wait_until(lambda: len(coordinator.held) == 1, what="the v5 id held")
        yield coordinator
    finally:
        await coordinator.stop()


@pytest.mark.parametrize("failure", list(FAILURES))
async def test_the_v4_timeout_sweep_goes_on_after_a_failed_round(
    store: MetadataStore, tmp_path: Path, failure: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The sweep's TIME_OUT write fails once: the next round times the transaction out."""
    settings = CoordinatorSettings(
        advertise_url="http://127.0.0.1:1",
        v4_coordinator_ids=1,
        ledger_url=f"file://{tmp_path / 'txn-logs'}",
        timeout_sweep_s=SWEEP_S,
    )
    v4 = CoordinatorV4(store, settings)
    await v4.start()
    try:
        await wait_until(lambda: 0 in v4.held, what="v4 id 0 held")
        write = FailsOnce(v4, "_log", FAILURES[failure](), lambda _, meta: meta.state == TIME_OUT)
        txn, _ = await v4.new_txn(timeout_s=0.1)
        await asyncio.wait_for(write.failed.wait(), 10)
        await wait_until(
            lambda: v4.status(txn).state == ABORTED, what=f"{txn} aborted at its timeout"
        )
    finally:
        await v4.stop()
    assert "injected" in caplog.text  # the failed round was logged


@pytest.mark.parametrize("failure", list(FAILURES))
async def test_the_v5_timeout_sweep_goes_on_after_a_failed_round(
    v5: CoordinatorV5, failure: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The sweep's abort fails once: the next round aborts the transaction."""
    abort = FailsOnce(v5, "end_txn", FAILURES[failure](), lambda *_: True)
    txn, _ = await v5.new_txn(timeout_s=0.1)
    await asyncio.wait_for(abort.failed.wait(), 10)

    # (its header may be collected as soon as it is ABORTED: gc_retention_s=0)
    await wait_until(lambda: v5.counters["timeouts"] == 1, what=f"{txn} aborted at its timeout")
    assert "injected" in caplog.text


async def test_the_v5_sweeps_go_on_after_a_failed_gc_round(
    v5: CoordinatorV5, store: MetadataStore, caplog: pytest.LogCaptureFixture
) -> None:
    """The GC sweep's look for op records fails once (a bug): both sweeps go on, and the
    header is collected at the next round. It stopped the timeout sweep too (both ran in
    one race)."""
    caplog.set_level(logging.WARNING, logger="segtxn")
    ended, _ = await v5.new_txn(timeout_s=60)
    ops = T.ops_prefix(ended)
    look = FailsOnce(store, "list_prefix", RuntimeError("injected: a bug"), lambda p: p == ops)
    await v5.end_txn(ended, TxnAction.COMMIT)
    await asyncio.wait_for(look.failed.wait(), 10)
    late, _ = await v5.new_txn(timeout_s=0.1)

    async def collected() -> bool:
        try:
            await v5.status(ended)
        except ServerError as e:
            return e.name is ErrorName.TRANSACTION_NOT_FOUND
        return False

    await wait_until(lambda: v5.counters["timeouts"] == 1, what=f"{late} aborted at its timeout")
    await wait_until(collected, what=f"the header of {ended} collected")
    assert "injected: a bug" in caplog.text
