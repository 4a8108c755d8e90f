"""A v4 coordinator whose transaction log stopped outside an append (its compaction met
another owner's fence) gives its id up at once, not at the next append.

The log (segtxn/coordinator/txnlog.py) is a compacted log; its compaction runs in the
background. A compaction whose rollover met another owner's change of the log's metadata
record stops the log's writer (segtxn/ledger/appends.py); the coordinator learned of it
only when a later call's append was refused (that call failing ``ServiceNotReady``), and
meanwhile kept answering from memory for an id whose log it could no longer write. Now
the stop itself gives the id up (a take-over reopens and replays the log), as a refused
append does.

A real coordinator on the in-memory store, its log in files.
"""

from __future__ import annotations

from pathlib import Path

from segtxn.coordinator.txnlog import log_name
from segtxn.coordinator.v4 import CoordinatorV4
from segtxn.metastore import MetadataStore, open_store
from segtxn.protocol.txn import TxnAction
from tests.broker.test_fenced_snapshot_unload import take_over
from tests.coordinator.test_v4_log_bound import settings
from tests.waiting import wait_until


async def test_a_log_fenced_by_its_compaction_gives_the_id_up_at_once(tmp_path: Path) -> None:
    store: MetadataStore = open_store("memory://")
    v4 = CoordinatorV4(store, settings(tmp_path, 4))
    await v4.start()
    try:
        await wait_until(lambda: 0 in v4.held, what="v4 id 0 held")
        held = v4.held[0]
        txn, _ = await v4.new_txn(timeout_s=3600)
        await take_over(store, log_name(0))
        await v4.end_txn(txn, TxnAction.COMMIT)  # (appends to a file ledger check no record)
        await v4.new_txn(timeout_s=3600)  # the 4th entry: a compaction starts, and meets it
        await wait_until(
            lambda: v4.counters["log_compaction_failures"] >= 1, what="the compaction failed"
        )
        assert held.giving_up  # at once: no call had to be refused first
        await wait_until(lambda: v4.held.get(0) not in (None, held), what="the id taken over again")
        again, _ = await v4.new_txn(timeout_s=3600)  # its log reopened: it serves
        assert again.least > txn.least
    finally:
        await v4.stop()
        await store.close()
