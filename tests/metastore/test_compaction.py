"""History compaction, on an etcd that compacts by itself (``compacting_etcd``: periodic
mode, one second of retention), as every etcd segtxn starts or deploys is configured to.

What the store promises when the history a watch needs is gone: the watch ends with
``Compacted``, never by stalling and never by skipping silently to later changes; whoever
built on it (elections here, the broker's header cache in tests/broker/test_compaction.py)
re-reads and carries on. Watches *started* from compacted history
(tests/metastore/test_watch.py) and a leader that keeps its key across a compaction
(tests/metastore/test_regressions.py) are tested on every backend elsewhere.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from segtxn.metastore import (
    Compacted,
    LeaderElection,
    MetadataStore,
    MetadataStoreError,
    StoreAccessDenied,
    StoreSettings,
    StoreUnavailable,
    open_store,
)
from segtxn.metastore.etcd_server import (
    DEFAULT_AUTO_COMPACTION,
    AutoCompaction,
    CompactionMode,
    EtcdServer,
)
from segtxn.metastore.faults import FaultInjector
from tests.waiting import take, wait_compacted, wait_until

Clients = Callable[[], MetadataStore]


def test_auto_compaction_becomes_etcd_flags() -> None:
    assert AutoCompaction.periodic(300).flags() == [
        "--auto-compaction-mode", "periodic", "--auto-compaction-retention", "300s",
    ]  # fmt: skip
    # A bare number would mean hours to etcd in periodic mode, so seconds carry their unit;
    # in revision mode the number is a count of revisions.
    assert AutoCompaction.revisions(10_000).flags()[1::2] == ["revision", "10000"]
    assert AutoCompaction(CompactionMode.PERIODIC, 300) == DEFAULT_AUTO_COMPACTION
    with pytest.raises(ValueError):
        AutoCompaction.periodic(0)  # etcd reads 0 as "never compact"


def test_every_private_etcd_compacts_unless_told_not_to(tmp_path: Path) -> None:
    default = EtcdServer(data_dir=tmp_path).command()
    assert default[default.index("--auto-compaction-mode") + 1] == "periodic"
    assert default[default.index("--auto-compaction-retention") + 1] == "300s"
    revisions = AutoCompaction.revisions(500)
    command = EtcdServer(data_dir=tmp_path, auto_compaction=revisions).command()
    assert command[command.index("--auto-compaction-mode") :][:4] == revisions.flags()
    off = EtcdServer(data_dir=tmp_path, auto_compaction=None).command()
    assert not any(arg.startswith("--auto-compaction") for arg in off)


@pytest.fixture
async def clients(compacting_etcd: EtcdServer) -> AsyncIterator[Clients]:
    """Clients of one fresh namespace on the compacting etcd, each engine wrapped in a
    FaultInjector (``store.engine``)."""
    url = compacting_etcd.url(f"/compact-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    opened: list[MetadataStore] = []

    def make() -> MetadataStore:
        store = open_store(url, StoreSettings(watch_retry_max_s=0.2), wrap=FaultInjector)
        opened.append(store)
        return store

    yield make
    for store in opened:
        await store.close()


def faults_of(store: MetadataStore) -> FaultInjector:
    engine = store.engine
    assert isinstance(engine, FaultInjector)
    return engine


async def test_etcd_compacts_its_history_by_itself(clients: Clients) -> None:
    """The auto-compaction flags reach etcd and take effect: nobody calls ``compact``."""
    store = clients()
    first = await store.put("/k", b"1")
    for i in range(10):
        await store.put("/k", str(i).encode())
    await wait_compacted(store, first.version)
    with pytest.raises(Compacted) as compacted:
        async with store.watch("/k", from_revision=first.version) as events:
            await take(events, 1)
    assert compacted.value.compacted_revision > first.version
    record = await store.get("/k")
    assert record is not None and record.value == b"9"  # compaction keeps the latest


async def test_a_watch_cut_off_past_the_history_ends_with_compacted(clients: Clients) -> None:
    """A resumable watch whose outage outlasted the history does not skip silently to the
    changes after it (nor stall): it ends with Compacted, and a re-list has the final state
    to watch on from."""
    store = clients()
    faults = faults_of(store)
    async with store.watch_prefix("/w/") as events:
        await store.put("/w/a", b"1")
        assert [e.record.value for e in await take(events, 1) if e.record] == [b"1"]
        faults.fail("watch", key_prefix="/w/", times=None)  # it cannot come back yet
        assert faults.drop_watches() == 1
        missed = await store.put("/w/a", b"2")
        await store.delete("/w/a")
        await store.put("/w/b", b"final")
        await wait_compacted(store, missed.version)
        faults.clear()
        with pytest.raises(Compacted):
            await take(events, 1)
    listing = await store.list_prefix("/w/")
    assert [(r.key, r.value) for r in listing.records] == [("/w/b", b"final")]
    async with store.watch_prefix("/w/", from_revision=listing.revision + 1) as events:
        await store.put("/w/c", b"next")
        assert [e.key for e in await take(events, 1)] == ["/w/c"]


async def test_a_rival_cut_off_past_the_history_wins_when_the_leader_left(
    clients: Clients,
) -> None:
    """The rival waits on a watch for the leader's key to go. The leader resigns while the
    rival's watch is down, and the deletion is compacted away before it comes back: the
    rival re-reads, finds the key gone, and wins."""
    leader_store, rival_store = clients(), clients()
    session = await leader_store.open_session(5)
    leadership = await LeaderElection(leader_store, "c", session, b"a").campaign()
    rival_session = await rival_store.open_session(5)
    rival = asyncio.create_task(LeaderElection(rival_store, "c", rival_session, b"b").campaign())
    rival_faults = faults_of(rival_store)
    try:
        await wait_until(lambda: rival_faults.open_watches == 1, what="the rival watching")
        rival_faults.fail("watch", times=None)
        assert rival_faults.drop_watches() == 1
        await leadership.resign()
        gone = await leader_store.revision()  # the deletion's revision
        await wait_compacted(leader_store, gone)
        assert not rival.done()  # still cut off: nothing told it yet
        rival_faults.clear()
        won = await asyncio.wait_for(rival, 15)
        assert won.token > leadership.token
        current = await LeaderElection(leader_store, "c", session).leader()
        assert current is not None and current.value == b"b"
        await won.resign()
    finally:
        rival.cancel()
        await asyncio.gather(rival, return_exceptions=True)
        await session.close()
        await rival_session.close()


@pytest.mark.parametrize("error", [StoreUnavailable, StoreAccessDenied])
async def test_store_errors_after_a_compaction_do_not_depose_a_leader(
    clients: Clients, error: type[MetadataStoreError]
) -> None:
    """Regression: a leadership's guard re-read its key after a compaction, and watched it
    again, outside the watch's own retries; a store error in either step ended the guard
    and set ``lost`` while the key was still the leader's. The v5 coordinator then
    campaigned again and waited for its own key to go, which it never does while the
    session lives: the coordinator id was served by nobody. A refusal
    (``StoreAccessDenied``: a permission taken away and given back) did so still."""
    store, other = clients(), clients()
    faults = faults_of(store)
    session = await store.open_session(5)
    election = LeaderElection(store, "d", session, b"a")
    leadership = await election.campaign()
    try:
        await wait_until(lambda: faults.open_watches == 1, what="the leader watching its key")
        faults.fail("watch", key_prefix=election.key, times=None)
        assert faults.drop_watches() == 1
        noise = await other.put("/noise", b"x")
        await wait_compacted(other, noise.version)
        faults.clear()
        faults.fail("range", key_prefix=election.key, error=error("injected"))  # 1st re-read
        held = faults.hold("range", key_prefix=election.key, times=1)  # the second is held...
        injected = faults.injected
        await held.wait_for(1)
        faults.fail("watch", key_prefix=election.key, error=error("injected"))  # ...till then
        held.release()
        await wait_until(
            lambda: faults.open_watches == 1 and faults.injected - injected == 3,
            what="the guard watching again, through every fault",
        )
        assert not leadership.lost.is_set()
        await other.delete(election.key)  # and the guard still works: now it is lost
        await asyncio.wait_for(leadership.lost.wait(), 10)
    finally:
        await leadership.resign()
        await session.close()
