"""A batch of orphans the store fails to record (segtxn/broker/txn/orphans.py): one failed
put leaves the rest unsettled at once, for the clean-up to retry.

Each was put in turn, each failure caught: with etcd silent (a partition), a refused batch
of N transactional sends took N request timeouts to orphan, and since the op record
writer's close waits for that orphaning (``settled_by``), a broker's stop waited as long,
before any step had failed for the store (so before its stop's time limit ran).

Real components: the in-memory store behind the fault injector."""

from __future__ import annotations

from segtxn.broker.txn.buffer_records import ORPHANS
from segtxn.broker.txn.orphans import Orphans
from segtxn.ledger import Position
from segtxn.metastore import open_store
from segtxn.metastore.faults import FaultInjector
from segtxn.protocol.txn import TxnId


async def test_one_failed_put_leaves_the_rest_of_a_batch_unsettled_at_once() -> None:
    store = open_store("memory://", wrap=FaultInjector)
    try:
        faults = store.engine
        assert isinstance(faults, FaultInjector)
        orphans = Orphans("segment://t/n/s/0", store)
        faults.fail("txn", key_prefix=ORPHANS, times=None)
        tried = faults.count("txn", key_prefix=ORPHANS)
        positions = [Position(1, n) for n in range(3)]

        await orphans.add_all(TxnId(1, 2), positions)

        assert tried.calls == 1, "a put tried for each orphan of a failing store"
        assert all(p in orphans for p in positions)  # never shown, whatever happens next
        assert orphans.floor() == Position(1, -1)  # all unsettled: the horizon stays before
        faults.clear()
        assert await orphans.settle()  # the clean-up records them all
        assert not orphans.unsettled
    finally:
        await store.close()
