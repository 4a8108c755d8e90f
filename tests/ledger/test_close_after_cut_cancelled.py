"""The close of a log that a cut-short step had opened runs to its end even when that
step is cancelled as the close starts (segtxn/ledger/logs.py ``close_log_after_cut``).

Found by the full suite: a pending-ack log's compaction, whose rollover met another
owner's fence, was cancelled by the close of the topic that fence unloads, while it closed
the rollover's new file; the cancel reached the close's thread job before a worker had
started it, the file stayed open and locked, and every later load of the topic on the
broker failed ("held by another writer"). Real files; the cancel comes at the first await.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from segtxn.ledger.files import FileLogStorage
from segtxn.ledger.logs import close_log_after_cut
from tests.waiting import wait_until


async def test_a_close_cancelled_as_it_starts_still_closes_and_unlocks_the_file(
    tmp_path: Path,
) -> None:
    storage = FileLogStorage(tmp_path)
    for attempt in range(20):  # each time: cancelled before a worker took the close up
        entry_log = storage.create("t", attempt + 1)
        closing = asyncio.create_task(close_log_after_cut("t", storage, entry_log))
        await asyncio.sleep(0)  # sleep-ok: one turn: the close is submitted, not yet run
        closing.cancel()
        await asyncio.gather(closing, return_exceptions=True)
        await wait_until(lambda: entry_log._fd == -1, timeout=5, what="the file closed")  # noqa: B023
        storage.open(  # not "held by another writer": the lock went with the close
            "t", attempt + 1, log_format=1, entries=0
        ).close()
