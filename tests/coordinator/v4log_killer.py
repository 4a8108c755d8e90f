"""A coordinator-log process for the SIGKILL test: it fills a v4 transaction log, prints
every transaction's state, then compacts it and SIGKILLs itself at one step of the
compaction (tests/compaction.py names the steps).

Usage: python -m tests.coordinator.v4log_killer STORE_URL DATA_DIR STEP SEED
Prints ``TXN <json>`` per transaction and ``NEXT <n>``, flushed, before the compaction; then
nothing (it is dead) unless the step was never reached (``NOT KILLED``).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from pathlib import Path

import msgspec

from segtxn.coordinator.txnlog import TxnLog
from segtxn.ledger import FileLogStorage
from segtxn.metastore import open_store
from tests import compaction
from tests.coordinator.test_v4_log import (
    KEEP_ENDED_S,
    NAME,
    NOW_MS,
    SMALL_LEDGERS,
    kept,
    populate,
)


def sigkill(where: str) -> None:
    print(f"DYING {where}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


async def main(url: str, data_dir: str, step: str, seed: int) -> None:
    store = open_store(url)
    storage = FileLogStorage(Path(data_dir))
    txn_log = await TxnLog.open(
        NAME, store, storage, SMALL_LEDGERS, compact_entries=0, keep_ended_s=KEEP_ENDED_S
    )
    await populate(txn_log, 120, random.Random(seed))
    for meta in txn_log.txns.values():
        print("TXN", msgspec.json.encode(meta).decode(), flush=True)
    print("NEXT", txn_log.next_least, flush=True)
    compaction.die = sigkill
    compaction.STEPS[step](txn_log._log, storage, len(kept(txn_log.txns)) // 2)
    await txn_log.compact(now_ms=NOW_MS)
    print("NOT KILLED", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
