"""A storage node's garbage: the sweep of replicas no placement names
(segtxn/ledger/replicas/sweep.py), ``stat``, and a node's bounded per-replica locks.

Real ``ReplicaNode``s on real files (behind real aiohttp servers where a writer needs
them), managed ledgers on the in-memory metadata store.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from segtxn.ledger import LedgerMissing, LedgerSettings, ManagedLedger, RetentionPolicy
from segtxn.ledger.replicas import HttpReplica, Member, ReplicaNode, sweep
from segtxn.ledger.replicas import node as node_module
from segtxn.metastore import MetadataStore
from tests.ledger.replicas import TIMEOUT_S, Cluster, started

NAME = "persistent://t/n/swept"
SMALL = LedgerSettings(max_ledger_bytes=300)
HOUR_S = 3600.0


def replicas_on(cluster: Cluster, i: int, name: str = NAME) -> list[int]:
    """The ledger ids node ``i`` holds a replica (file) of."""
    directory = cluster.servers[i].node._files._dir(name)
    if not directory.exists():
        return []
    return sorted(int(p.stem) for p in directory.glob("*.log"))


def age(node: ReplicaNode, name: str, ledger_id: int, seconds: float) -> None:
    """Make the replica's files look left alone for ``seconds``."""
    then = time.time() - seconds
    for path in (node._files.path(name, ledger_id), node._fence_path((name, ledger_id))):
        if path.exists():
            os.utime(path, (then, then))


async def test_the_sweep_removes_replicas_a_node_missed_the_deletion_of_and_keeps_the_rest(
    store: MetadataStore, cluster: Cluster
) -> None:
    """b2 is away while the owner trims old ledgers and deletes another topic: it keeps
    their replicas. Back, its sweep removes exactly those (once they are older than the
    grace period), and keeps every replica a placement names."""
    await started(cluster, 3)
    storage = cluster.storage(0, write=3, ack=2)
    ledger = await ManagedLedger.open(NAME, store, storage, SMALL)
    other = await ManagedLedger.open("persistent://t/n/deleted", store, storage, SMALL)
    for i in range(20):
        await ledger.append(f"entry-{i:03d}".encode() * 4)
        await other.append(b"gone soon")
    await cluster.stop(2)
    trimmed = await ledger.trim(RetentionPolicy(retention_time_s=1), now_s=time.time() + 60)
    assert len(trimmed.ledgers) >= 2
    await other.delete()
    await cluster.start(2)
    b2 = cluster.servers[2]
    held_before = replicas_on(cluster, 2)
    assert set(trimmed.ledgers) <= set(held_before)
    assert replicas_on(cluster, 2, "persistent://t/n/deleted")

    assert await sweep(b2.node, store, b2.member, grace_s=HOUR_S) == []  # all too young
    for ledger_id in held_before:
        age(b2.node, NAME, ledger_id, 2 * HOUR_S)
    for ledger_id in replicas_on(cluster, 2, "persistent://t/n/deleted"):
        age(b2.node, "persistent://t/n/deleted", ledger_id, 2 * HOUR_S)
    removed = await sweep(b2.node, store, b2.member, grace_s=HOUR_S)

    gone = {(n, i) for n, i in removed}
    assert {(NAME, i) for i in trimmed.ledgers} <= gone
    assert {n for n, _ in gone} == {NAME, "persistent://t/n/deleted"}
    assert replicas_on(cluster, 2, "persistent://t/n/deleted") == []
    assert replicas_on(cluster, 2) == ledger.ledger_ids  # each ledger still named: kept
    assert await sweep(cluster.servers[0].node, store, cluster.servers[0].member, grace_s=0) == []
    await ledger.append(b"written after the sweep")
    await ledger.close()


async def test_a_replica_touched_after_it_was_listed_is_not_removed(tmp_path: Path) -> None:
    """A candidate is checked again under its lock: a create or an append since it was
    listed (a recovery or repair copying to it) keeps it."""
    node = ReplicaNode(tmp_path, tail_bytes=1 << 20)
    node.create(NAME, 1)
    node.append(NAME, 1, 0, [b"a"], True)
    age(node, NAME, 1, 10)
    cutoff = time.time_ns() - 5 * 10**9
    assert node.untouched(cutoff) == [(NAME, 1)]
    node.append(NAME, 1, 1, [b"b"], True)  # a copy going on
    assert not node.remove_untouched(NAME, 1, cutoff)
    assert node.read(NAME, 1, 0, 1) == [b"a", b"b"]

    node.create(NAME, 2)  # an empty replica a failed create left, reused by a later one
    age(node, NAME, 2, 10)
    assert (NAME, 2) in node.untouched(cutoff)
    node.create(NAME, 2)
    assert not node.remove_untouched(NAME, 2, cutoff)
    node.close()


async def test_a_fence_without_its_replica_is_swept_too(
    store: MetadataStore, tmp_path: Path
) -> None:
    node = ReplicaNode(tmp_path, tail_bytes=1 << 20)
    with pytest.raises(LedgerMissing):
        node.fence(NAME, 7)  # (a recovery fenced a replica this node never had)
    age(node, NAME, 7, 2 * HOUR_S)
    member = Member("b9", node.instance)
    assert await sweep(node, store, member, grace_s=HOUR_S) == [(NAME, 7)]
    assert not node._fence_path((NAME, 7)).exists()
    node.close()


async def test_stat_answers_the_count_and_size_and_changes_nothing(cluster: Cluster) -> None:
    server = (await started(cluster, 1)).servers[0]

    async def locate(broker: str) -> str | None:
        return server.url

    replica = HttpReplica(server.member, locate, cluster.session, timeout_s=TIMEOUT_S)
    await replica.create(NAME, 1)
    await replica.append(NAME, 1, 0, [b"a", b"bc"], recovery=False)
    count, size = await replica.stat(NAME, 1)
    assert count == 2 and size == server.node.stat(NAME, 1)[1] > 0
    await replica.append(NAME, 1, 2, [b"d"], recovery=False)  # not fenced by a stat
    with pytest.raises(LedgerMissing):
        await replica.stat(NAME, 2)
    assert not server.node._fence_path((NAME, 2)).exists()


def test_a_node_keeps_locks_only_for_the_replicas_it_holds_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lock per ledger ever touched stayed for the node's life (millions, for a long
    lived broker); now one lives while its replica is open or in use."""
    monkeypatch.setattr(node_module, "MAX_OPEN", 3)
    node = ReplicaNode(tmp_path, tail_bytes=1 << 20)
    for ledger_id in range(1, 41):
        node.create(NAME, ledger_id)
        node.append(NAME, ledger_id, 0, [b"x"], False)
        node.stat(NAME, ledger_id)
        assert node.read(NAME, ledger_id, 0, 0) == [b"x"]
        assert len(node._locks) <= 3
    with pytest.raises(LedgerMissing):
        node.fence(NAME, 99)
    assert len(node._locks) <= 3
    for ledger_id in range(1, 41):
        node.delete(NAME, ledger_id)
    assert node._locks == {} and not node._held
    for ledger_id in range(1, 41, 7):  # asked of replicas that are gone: no lock stays
        with pytest.raises(LedgerMissing):
            node.stat(NAME, ledger_id)
    assert node._locks == {}
    node.close()
