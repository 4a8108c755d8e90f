"""A scan of a file ledger whose pages are cached lets the event loop run between its
reads, as it did when every read took a worker thread.

The broker's load-time scans (segtxn/broker/txn/markers.py ``_replay``, dedup.py's, the
orphans' ``find``) read 1000 entries at a time in a loop with no other await. Since
``FileEntryLog.read_async`` answers a read of cached bytes in the loop (below
``IN_LOOP_READ_BYTES``), such a read never yields: a replay of a long ledger of small
messages (hot in the page cache after a broker's restart) holds the event loop for the
whole scan, and every other task (lease keep-alives, dispatchers, other topics' loads)
waits for its end.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from segtxn.ledger import LedgerSettings, ManagedLedger
from segtxn.ledger.files import FileLogStorage
from segtxn.metastore import MetadataStore

pytestmark = pytest.mark.skipif(not hasattr(os, "RWF_NOWAIT"), reason="Linux's RWF_NOWAIT")


async def test_a_scan_of_cached_entries_lets_other_tasks_run_between_its_reads(
    store: MetadataStore, tmp_path: Path
) -> None:
    ledger = await ManagedLedger.open(
        "persistent://t/n/scan", store, FileLogStorage(tmp_path), LedgerSettings()
    )
    try:
        for _ in range(20):
            await asyncio.gather(*(ledger.append(b"x" * 100) for _ in range(1000)))
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)  # sleep-ok: one turn of the loop, counted

        ticking = asyncio.create_task(ticker())
        await asyncio.sleep(0)  # sleep-ok: the ticker starts
        start, reads, before = ledger.first_position(), 0, ticks
        while start is not None:  # as markers.py's _replay scans
            entries = await ledger.read(start, max_entries=1000, max_bytes=64 << 20)
            if not entries:
                break
            reads += 1
            start = ledger.position_after(entries[-1].position)
        ticked = ticks - before
        ticking.cancel()
        assert reads >= 20
        assert ticked >= reads // 2, f"{reads} reads, the loop ran other tasks {ticked} times"
    finally:
        await ledger.close()
