"""A v4 coordinator that runs for months: its transaction log stays bounded.

Thousands of transactions through a real coordinator (its HTTP server for ``/metrics``,
real files, the embedded store and etcd): the log a take-over would replay, and the files on
disk, stay under a bound set by ``v4_log_compact_entries``; the same run without compaction
grows past it (so the bound is not vacuous). The next holder recovers the same open
transactions and never reuses a number; a compaction that fails is retried and loses
nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from segtxn.coordinator.app import V4, CoordinatorServer
from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.coordinator.txnlog import FINAL, TxnMeta, log_name
from segtxn.coordinator.v4 import CoordinatorV4
from segtxn.ledger.metadata import decode, metadata_key
from segtxn.metastore import MetadataStore, open_store
from segtxn.metastore.etcd_server import EtcdServer, free_port
from segtxn.metastore.faults import FaultInjector
from segtxn.metastore.memory import MemoryEngine
from segtxn.metastore.settings import StoreSettings
from segtxn.protocol.txn import TxnAction, TxnId
from segtxn.web import Listener
from tests.waiting import wait_until

TRANSACTIONS = 2000
LEFT_OPEN = 10
WAVE = 50
"""Transactions in flight at once (their entries share group commits)."""
COMPACT_ENTRIES = 300
ENTRY_BYTES = 256
"""More than one log entry of these transactions takes on disk, record header included."""


@dataclass
class Run:
    max_entries: int = 0
    max_bytes: int = 0
    max_files: int = 0
    open: dict[int, TxnMeta] | None = None
    issued: int = 0


async def store_for(request: pytest.FixtureRequest, kind: str) -> MetadataStore:
    if kind == "memory":
        return open_store("memory://", wrap=FaultInjector)
    server: EtcdServer = request.getfixturevalue("etcd_server")
    return open_store(server.url(f"/v4bound-{os.getpid()}-{uuid.uuid4().hex[:8]}"))


def settings(tmp_path: Path, compact_entries: int, port: int = 0) -> CoordinatorSettings:
    """``port``: the one its server listens on (else one nothing listens on: no server)."""
    return CoordinatorSettings(
        advertise_url=f"http://127.0.0.1:{port or free_port()}",
        v4_coordinator_ids=1,
        v4_log_compact_entries=compact_entries,
        gc_retention_s=0,
        timeout_sweep_s=3600,
        ledger_url=f"file://{tmp_path / 'txn-logs'}",
    )


def on_disk(tmp_path: Path) -> tuple[int, int]:
    """(files, bytes) of the log's ledgers on disk (a file trimmed between the listing and
    its size, on the ledger's deleting thread, is not counted)."""
    sizes = []
    for file in (tmp_path / "txn-logs").rglob("*.log"):
        with contextlib.suppress(FileNotFoundError):
            sizes.append(file.stat().st_size)
    return len(sizes), sum(sizes)


async def drive(v4: CoordinatorV4, tmp_path: Path, seed: int) -> Run:
    """TRANSACTIONS transactions, WAVE at a time, LEFT_OPEN of them left open; the log's
    size is sampled after every wave."""
    rng = random.Random(seed)
    run = Run()
    keep_open = set(rng.sample(range(TRANSACTIONS), LEFT_OPEN))

    async def one(i: int) -> None:
        txn, _ = await v4.new_txn(timeout_s=3600)
        if i not in keep_open:
            await v4.end_txn(txn, rng.choice([TxnAction.COMMIT, TxnAction.ABORT]))

    for start in range(0, TRANSACTIONS, WAVE):
        await asyncio.gather(*(one(i) for i in range(start, min(start + WAVE, TRANSACTIONS))))
        held = v4.held[0]
        files, size = on_disk(tmp_path)
        run.max_entries = max(run.max_entries, held.log.entries)
        run.max_bytes = max(run.max_bytes, size)
        run.max_files = max(run.max_files, files)
    held = v4.held[0]
    run.open = {n: m for n, m in held.txns.items() if m.state not in FINAL}
    run.issued = held.log.next_least
    return run


COMPACTIONS = 'segtxn_txn_v4_log_compactions_total{log="transaction"}'


async def metrics(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as response:
        text = await response.text()
    out = {}
    for line in text.splitlines():
        if line.startswith("segtxn_txn_v4_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


@pytest.mark.parametrize(
    ("kind", "compact_entries"),
    [("memory", COMPACT_ENTRIES), ("etcd", COMPACT_ENTRIES), ("memory", 0)],
)
async def test_the_log_stays_bounded_over_thousands_of_transactions(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str, compact_entries: int
) -> None:
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    store = await store_for(request, kind)
    listener = Listener("127.0.0.1")  # its port, held from the pick on
    server = CoordinatorServer(
        settings(tmp_path, compact_entries, listener.port), store=store, listener=listener
    )
    await server.start()
    try:
        v4 = server.app[V4]
        await wait_until(lambda: 0 in v4.held, what="v4 id 0 held")
        run = await drive(v4, tmp_path, seed)
        held = v4.held[0]
        await wait_until(lambda: not held.log.compacting, what="the last compaction done")
        exported = await metrics(server.settings.advertise_url)
        assert exported['segtxn_txn_v4_log_entries{coordinator="0"}'] == held.log.entries
        assert exported['segtxn_txn_v4_log_bytes{coordinator="0"}'] == held.log.size_bytes
        print(
            f"compact_entries={compact_entries}: max {run.max_entries} entries, "
            f"{run.max_bytes} bytes in {run.max_files} files; now {held.log.entries} "
            f"entries, {held.log.size_bytes} bytes; "
            f"{exported[COMPACTIONS]:.0f} compactions"
        )
    finally:
        await server.stop()
    # the bound: the threshold, what one compaction keeps, and what arrives while it runs
    # (appends go on while it trims, and a slow store CAS there, on these two shared
    # cores, has let up to 450 entries in: allow two thresholds' worth), plus a wave of 3
    # entries per transaction in flight. Measured: ~400 most runs, 750 at worst.
    bound = 3 * COMPACT_ENTRIES + 3 * WAVE + LEFT_OPEN
    if compact_entries:
        assert run.max_entries <= bound
        assert run.max_bytes <= bound * ENTRY_BYTES
        assert run.max_files <= 3
        assert exported[COMPACTIONS] >= 3 * TRANSACTIONS // bound
        assert exported["segtxn_txn_v4_log_dropped_txns_total"] >= TRANSACTIONS - bound
    else:  # the same run, never compacted: every entry of every transaction stays
        assert run.max_entries >= 3 * TRANSACTIONS - LEFT_OPEN * 2 > 5 * bound
        assert exported[COMPACTIONS] == 0

    successor = CoordinatorV4(store, settings(tmp_path, compact_entries))
    await successor.start()  # the next holder of the id
    try:
        await wait_until(lambda: 0 in successor.held, what="id 0 taken over")
        held = successor.held[0]
        assert {n: m for n, m in held.txns.items() if m.state not in FINAL} == run.open
        assert len(run.open or {}) == LEFT_OPEN
        txn, _ = await successor.new_txn()
        assert txn == TxnId(0, run.issued)  # no number issued before is issued again
    finally:
        await successor.stop()
        await store.close()


async def test_a_failed_compaction_is_retried_and_loses_nothing(tmp_path: Path) -> None:
    """The store refuses the compaction's cursor move once: the failure is counted and
    logged, the log stays as it was (and correct), and the compaction the next append
    starts succeeds."""
    faults = FaultInjector(MemoryEngine())
    store = MetadataStore(faults, StoreSettings(), owns_engine=True)
    v4 = CoordinatorV4(store, settings(tmp_path, 20))
    await v4.start()
    try:
        await wait_until(lambda: 0 in v4.held, what="v4 id 0 held")
        opened = {(await v4.new_txn(timeout_s=3600))[0].least for _ in range(3)}
        faults.fail("txn", key_prefix=f"/managed-cursors/{log_name(0)}")
        for _ in range(24):  # 72 entries: past 20 several times
            txn, _ = await v4.new_txn()
            await v4.end_txn(txn, TxnAction.COMMIT)
        await wait_until(lambda: not v4.held[0].log.compacting, what="compactions done")
        assert v4.counters["log_compaction_failures"] == 1
        assert v4.counters["log_compactions"] >= 1
        held = v4.held[0]
        assert {n for n, m in held.txns.items() if m.state not in FINAL} == opened
        assert held.log.entries < 3 + 3 * 24  # trimmed
    finally:
        await v4.stop()
    successor = CoordinatorV4(store, settings(tmp_path, 20))
    await successor.start()
    try:
        await wait_until(lambda: 0 in successor.held, what="id 0 taken over")
        recovered = successor.held[0].txns
        assert {n for n, m in recovered.items() if m.state not in FINAL} == opened
    finally:
        await successor.stop()
        await store.close()


async def test_a_compaction_failing_unexpectedly_is_logged_and_the_next_append_retries(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log's ledger fails a compaction's roll-over once with an error that is no ledger's
    or store's (a bug): it is counted and logged at ERROR with its traceback, and the
    compaction the next append starts succeeds. Only ledger and store errors were caught:
    this one ended the compaction's task, uncounted, with asyncio's "Task exception was
    never retrieved" at best."""
    store = open_store("memory://")
    v4 = CoordinatorV4(store, settings(tmp_path, 20))
    await v4.start()
    try:
        await wait_until(lambda: 0 in v4.held, what="v4 id 0 held")
        held = v4.held[0]
        ledger = held.log.ledger
        real = ledger.roll_over
        failed = asyncio.Event()

        async def roll_over_failing_once() -> object:
            if not failed.is_set():
                failed.set()
                raise RuntimeError("injected bug")
            return await real()

        monkeypatch.setattr(ledger, "roll_over", roll_over_failing_once)
        opened = {(await v4.new_txn(timeout_s=3600))[0].least for _ in range(3)}
        for _ in range(24):  # 72 entries: past 20 several times
            txn, _ = await v4.new_txn()
            await v4.end_txn(txn, TxnAction.COMMIT)
        await wait_until(lambda: not held.log.compacting, what="compactions done")
        assert failed.is_set()
        assert v4.counters["log_compaction_failures"] == 1
        assert v4.counters["log_compactions"] >= 1
        said = [r for r in caplog.records if "injected bug" in r.getMessage()]
        assert [(r.levelno, r.exc_info is not None) for r in said] == [(logging.ERROR, True)]
        assert {n for n, m in held.txns.items() if m.state not in FINAL} == opened
        assert held.log.entries < 3 + 3 * 24  # trimmed
    finally:
        await v4.stop()
        await store.close()


async def test_the_timeout_sweep_skips_a_transaction_compacted_away_meanwhile(
    tmp_path: Path,
) -> None:
    """The sweep lists the open transactions past their deadline, then takes each one's
    lock: one that ended and was compacted away meanwhile is skipped (it raised KeyError,
    which ended the sweep task for good)."""
    store = open_store("memory://")
    v4 = CoordinatorV4(store, settings(tmp_path, 20))
    await v4.start()
    try:
        await wait_until(lambda: 0 in v4.held, what="v4 id 0 held")
        txn, meta = await v4.new_txn(timeout_s=0.001)
        await wait_until(lambda: time.time() * 1000 > meta.timeout_ms, what="its deadline")
        held = v4.held[0]
        async with held.locks.setdefault(txn.least, asyncio.Lock()):
            sweeping = asyncio.create_task(v4.sweep_timeouts(), name="sweep")
            await asyncio.sleep(0)  # sleep-ok: one loop step: the sweep waits for the lock
            del held.txns[txn.least]  # what a compaction does to an ended transaction
        assert await sweeping == 0
    finally:
        await v4.stop()
        await store.close()


async def test_a_stop_during_a_compactions_rollover_closes_the_log_cleanly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The stop cancels a compaction in flight, then closes the log. Cancelled while its
    rollover's CAS was in flight (landed, its answer not yet back), the ledger took the
    rollover for failed, and the close's clean-close write found it: "closing v4 id 0's
    log failed: LedgerFenced: ... a rollover of its own landed though it seemed to fail"."""
    faults = FaultInjector(MemoryEngine())
    store = MetadataStore(faults, StoreSettings(), owns_engine=True)
    v4 = CoordinatorV4(store, settings(tmp_path, 20))
    await v4.start()
    try:
        await wait_until(lambda: 0 in v4.held, what="v4 id 0 held")
        held = v4.held[0]
        opened = {(await v4.new_txn(timeout_s=3600))[0].least for _ in range(3)}
        rollover = faults.hold("txn", key_prefix=metadata_key(log_name(0)))

        def started() -> bool:  # (due until the compaction's task runs)
            return held.log.due or held.log.compacting

        ends: list[asyncio.Task[object]] = []
        while not started():  # the append that makes it due starts the compaction; an
            txn, _ = await v4.new_txn()  # end's next append then waits for it
            if not started():
                ends.append(asyncio.create_task(v4.end_txn(txn, TxnAction.COMMIT)))
                await wait_until(lambda: ends[-1].done() or started(), what="end or due")
        await rollover.wait_for(1)  # applied in the store, its answer parked
        stopping = asyncio.create_task(v4.stop())
        await wait_until(lambda: not v4._tasks or all(t.cancelling() for t in v4._tasks))
        rollover.release()
        await stopping
        await asyncio.gather(*ends, return_exceptions=True)
        failed = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert not failed
        record = await store.get(metadata_key(log_name(0)))
        assert record is not None
        assert decode(record.value).ledgers[-1].entries is not None, "no clean close recorded"
    finally:
        await v4.stop()
    successor = CoordinatorV4(store, settings(tmp_path, 20))
    await successor.start()
    try:
        await wait_until(lambda: 0 in successor.held, what="id 0 taken over")
        recovered = successor.held[0].txns
        assert opened <= {n for n, m in recovered.items() if m.state not in FINAL}
    finally:
        await successor.stop()
        await store.close()
