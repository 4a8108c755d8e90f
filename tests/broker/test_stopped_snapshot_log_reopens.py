"""A namespace's v4 snapshot log whose writer stopped for a reason reopening may cure is
reopened by its next use; the topics go on snapshotting into it.

The snapshot log (segtxn/broker/txn/snapshots.py) is a managed ledger of its own, one per
namespace and broker, opened once and kept. A stop of its writer (a compaction's rollover
that met a fence or whose outcome the store left unknown, a full disk, too few replicas)
was for good: the broker kept the stopped log, every later snapshot of every topic of the
namespace failed (logged at ERROR), and recovery replayed ever more of each ledger, until
the broker restarted. Unloading the topics would cure nothing (loaded again, they use the
same log), so the log itself is let go and opened again, as a topic is for its ledger.

Real components: the cluster's broker and coordinator on the in-memory store, files in
``tmp_path``; "another owner" changes the log's metadata record as an open of it would.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from segtxn.broker.txn.markers import MarkerTransactionBuffer
from segtxn.broker.txn.snapshots import BufferSnapshot, SnapshotLog, snapshot_log
from segtxn.client import Client, Producer, ScalableProducer, Transaction
from segtxn.ledger import LedgerClosed, LedgerFenced, WriteFailed
from segtxn.protocol.names import TopicName
from tests.broker.test_fenced_snapshot_unload import take_over
from tests.cluster import Cluster
from tests.txn.test_v4 import loaded, restart_broker
from tests.waiting import wait_until

TOPIC = "persistent://acme/v4snap/t"
LOG = snapshot_log("acme", "v4snap", "b1")
COMPACT_ENTRIES = 4


async def one_open_transaction(
    cluster: Cluster, client: Client
) -> tuple[Producer | ScalableProducer, Transaction, MarkerTransactionBuffer]:
    """``TOPIC`` holding one open v4 transaction's message: its producer, the
    transaction, and the topic's buffer."""
    await client.admin.create_topic(TOPIC)
    producer = await client.create_producer(TOPIC)
    open_ = client.transaction()
    await producer.send(b"o", txn=open_)
    return producer, open_, await loaded(cluster, TOPIC)


@pytest.mark.parametrize("cluster", ["memory"], indirect=True)
async def test_a_snapshot_log_fenced_by_a_compaction_is_reopened_by_the_next_snapshot(
    cluster: Cluster,
) -> None:
    await restart_broker(cluster, txn_log_compact_entries=COMPACT_ENTRIES)
    snapshots = cluster.broker.service.snapshots
    async with Client(cluster.url) as client:
        producer, open_, buffer = await one_open_transaction(cluster, client)
        for _ in range(COMPACT_ENTRIES):  # the next snapshot compacts the log first
            await buffer.snapshot()
        stopped = await snapshots.get("acme", "v4snap")
        await take_over(cluster.store, LOG)
        # its compaction met the fence: the log stopped, and is let go of; the write is
        # refused by the stopped log, or, let go of first (LedgerClosed), goes into the
        # log opened again
        with contextlib.suppress(WriteFailed):
            await buffer.snapshot()
        late = client.transaction()
        await producer.send(b"late", txn=late)
        await buffer.snapshot()  # into the log opened again
        reopened = await snapshots.get("acme", "v4snap")
        assert reopened is not stopped
        assert stopped.ledger.is_closing  # (let go of before the open: one writer)
        latest = await reopened.latest(TOPIC)
        last = cluster.broker.service.topics[TopicName.parse(TOPIC)].ledger.last_confirmed
        assert latest is not None and last is not None
        assert latest.position == (last.ledger_id, last.entry_id)
        assert set(latest.ongoing) == {str(open_.id), str(late.id)}
        await open_.abort()
        await late.abort()


@pytest.mark.parametrize("cluster", ["memory"], indirect=True)
async def test_a_use_of_a_log_let_go_of_under_it_goes_on_in_the_log_opened_again(
    cluster: Cluster,
) -> None:
    """A recovery that took the namespace's log before its writer stopped reads it after
    the log was closed to be opened again: it reads the reopened one (it failed the
    topic's load with LedgerClosed)."""
    await restart_broker(cluster, txn_log_compact_entries=COMPACT_ENTRIES)
    snapshots = cluster.broker.service.snapshots
    async with Client(cluster.url) as client:
        _, open_, buffer = await one_open_transaction(cluster, client)
        await buffer.snapshot()
        taken, go_on = asyncio.Event(), asyncio.Event()
        used: list[SnapshotLog] = []

        async def latest(log_: SnapshotLog) -> BufferSnapshot | None:
            used.append(log_)
            if len(used) == 1:  # the first use holds the log while it is let go of
                taken.set()
                await go_on.wait()
            return await log_.latest(TOPIC)

        reading = asyncio.create_task(snapshots._in_log("acme", "v4snap", latest))
        await taken.wait()
        (stopped,) = used
        stopped.ledger.fenced(LedgerFenced("another owner, as a fenced compaction proves"))
        await wait_until(lambda: stopped.ledger.is_closing, what="the stopped log let go of")
        await wait_until(lambda: not snapshots._letting_go, what="its close done")
        with pytest.raises(LedgerClosed):
            await stopped.latest(TOPIC)  # (what the first use now meets)
        go_on.set()
        found = await asyncio.wait_for(reading, 10)
        assert len(used) == 2 and used[1] is not stopped
        assert found is not None and set(found.ongoing) == {str(open_.id)}


@pytest.mark.parametrize("cluster", ["memory"], indirect=True)
async def test_a_background_snapshot_refused_by_a_stopped_log_is_a_warning_not_a_traceback(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A stopped log refusing a snapshot is expected operations (the log is opened again
    on its next use, and replay covers the snapshot): it was logged at ERROR with a
    traceback, as a bug is."""
    async with Client(cluster.url) as client:
        _, _, buffer = await one_open_transaction(cluster, client)

        async def refused() -> None:
            raise WriteFailed("the log's writer stopped", LedgerFenced("another owner"))

        monkeypatch.setattr(buffer, "snapshot", refused)
        with caplog.at_level(logging.WARNING):
            await buffer._snapshot()
    (said,) = [r for r in caplog.records if "snapshot failed" in r.getMessage()]
    assert said.levelno == logging.WARNING and said.exc_info is None
    assert "the log's writer stopped" in said.getMessage()


@pytest.mark.parametrize("cluster", ["memory"], indirect=True)
async def test_no_snapshot_log_is_opened_once_they_are_closed(cluster: Cluster) -> None:
    """(A topic closing late in a broker's stop snapshots: a log opened then stayed open.)"""
    snapshots = cluster.broker.service.snapshots
    await snapshots.close()
    with pytest.raises(LedgerClosed, match="snapshot logs are closed"):
        snapshots.get("acme", "v4snap")
    assert snapshots.opened() == []
