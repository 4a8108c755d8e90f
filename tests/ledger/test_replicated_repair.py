"""Re-replication of closed ledgers (segtxn/ledger/replicas/repair.py) and the node-side
sweep of what no placement names (sweep.py).

Real ``ReplicaNode``s on real files behind real aiohttp servers (tests/ledger/replicas.py),
managed ledgers on the in-memory metadata store. Races are made deterministic by holding a
repair's copy at a gate while the owner (or another one) changes the ledger.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest

from segtxn.ledger import LedgerSettings, ManagedLedger, RetentionPolicy, WriteFailed
from segtxn.ledger.managed import metadata_key
from segtxn.ledger.metadata import LedgerInfo, decode
from segtxn.ledger.replicas import (
    Census,
    Member,
    Nodes,
    Outcome,
    Replica,
    ReplicatedLogStorage,
    repair_ledger,
    sweep,
)
from segtxn.metastore import MetadataStore
from tests.ledger.replicas import Cluster, TestNodes, payloads_of, started

NAME = "persistent://t/n/repaired"
SMALL = LedgerSettings(max_ledger_bytes=300)
"""Ledgers roll over every few entries: a topic with several closed ledgers."""
SENT = [f"entry-{i:03d}".encode() * 4 for i in range(20)]


async def stored(store: MetadataStore) -> dict[int, LedgerInfo]:
    record = await store.get(metadata_key(NAME))
    assert record is not None
    return {i.id: i for i in decode(record.value).ledgers}


def closed(ledger: ManagedLedger) -> list[LedgerInfo]:
    return [i for i in ledger.ledgers if i.entries is not None]


async def written(store: MetadataStore, storage: ReplicatedLogStorage) -> ManagedLedger:
    """A managed ledger on ``storage`` holding :data:`SENT` over several ledgers."""
    ledger = await ManagedLedger.open(NAME, store, storage, SMALL)
    for payload in SENT:
        await ledger.append(payload)
    assert len(closed(ledger)) >= 3
    return ledger


async def repair(ledger: ManagedLedger, info: LedgerInfo, census: Census, nodes: Nodes) -> Outcome:
    return await repair_ledger(ledger, info, census, nodes, write_quorum=3, commit_within_s=60.0)


# ----------------------------------------------------------------- a gate for races


class GatedNodes:
    """``nodes``, but every recovery append to ``held`` waits at the gate: ``copying`` is
    set when the first one arrives, and they go on once ``release`` is set."""

    def __init__(self, nodes: TestNodes, held: Member) -> None:
        self.local = nodes.local
        self._nodes = nodes
        self._held = held
        self.copying = asyncio.Event()
        self.release = asyncio.Event()

    async def alive(self) -> list[Member]:
        return await self._nodes.alive()

    def replica(self, member: Member) -> Replica:
        replica = self._nodes.replica(member)
        return GatedReplica(replica, self) if member == self._held else replica


class GatedReplica:
    def __init__(self, replica: Replica, gate: GatedNodes) -> None:
        self.member = replica.member
        self._replica = replica
        self._gate = gate

    async def create(self, name: str, ledger_id: int) -> int:
        return await self._replica.create(name, ledger_id)

    async def discard(self, name: str, ledger_id: int, claim: int) -> bool:
        return await self._replica.discard(name, ledger_id, claim)

    async def append(
        self, name: str, ledger_id: int, first: int, payloads: Sequence[bytes], *, recovery: bool
    ) -> int:
        if recovery:
            self._gate.copying.set()
            await self._gate.release.wait()
        return await self._replica.append(name, ledger_id, first, payloads, recovery=recovery)

    async def fence(self, name: str, ledger_id: int) -> tuple[int, int]:
        return await self._replica.fence(name, ledger_id)

    async def stat(self, name: str, ledger_id: int) -> tuple[int, int]:
        return await self._replica.stat(name, ledger_id)

    async def read(self, name: str, ledger_id: int, first: int, last: int) -> list[bytes]:
        return await self._replica.read(name, ledger_id, first, last)

    async def delete(self, name: str, ledger_id: int) -> None:
        await self._replica.delete(name, ledger_id)


def only_target(census: Census, member: Member) -> Census:
    return Census(census.registered, census.gone, (member,))


# ----------------------------------------------------------------- repairs


async def test_a_wiped_nodes_copies_are_made_again_and_served_once_the_old_ones_are_gone(
    store: MetadataStore, cluster: Cluster
) -> None:
    """b1 comes back on an empty disk (a new instance): each closed ledger kept on b0, b1
    and b2 gets a third copy again, the placement says where, and the entries are read
    from the new copy alone once b0's and b2's copies are deleted."""
    await started(cluster, 4)
    await cluster.stop(3)  # every ledger goes on b0, b1, b2
    storage = cluster.storage(0, write=3, ack=2)
    ledger = await written(store, storage)
    old_b1 = cluster.servers[1].member
    await cluster.start(3)
    await cluster.restart(1, wipe=True)
    census = cluster.census()
    infos = closed(ledger)
    assert [census.wanted(i, 3) for i in infos] == [1] * len(infos)

    outcomes = [await repair(ledger, i, census, storage.nodes) for i in infos]

    assert outcomes == [Outcome.REPAIRED] * len(infos)
    alive = {s.member for s in cluster.servers}
    after = await stored(store)
    for info in infos:
        members = [Member.parse(m) for m in after[info.id].replicas]
        assert len(members) == 3 and set(members) <= alive and old_b1 not in members
        new = next(m for m in members if m.broker not in ("b0", "b2"))
        holder = next(i for i, s in enumerate(cluster.servers) if s.member == new)
        assert cluster.holds(holder, NAME, info.id) == info.entries
        assert after[info.id].entries == info.entries  # only the placement changed
        assert cluster.census().wanted(after[info.id], 3) == 0
    for info in infos:  # the old copies go: each ledger is left on its new copy alone
        cluster.servers[0].node.delete(NAME, info.id)
        cluster.servers[2].node.delete(NAME, info.id)
    assert await payloads_of(ledger) == SENT
    await ledger.append(b"the owner goes on writing")  # the repairs did not fence it
    await ledger.close()


async def test_a_copy_behind_is_topped_up_in_place_and_a_whole_ledger_is_left_alone(
    store: MetadataStore, cluster: Cluster
) -> None:
    """b2's server stops while the owner writes (the ack quorum goes on without it, and
    the ledger it missed closes) and starts again on the same files: every copy is
    registered, yet b2's copy of that ledger holds a prefix. Asking the copies tops it up
    in place (the placement is unchanged: no compare-and-set), and a ledger whose copies
    are all whole is reported WHOLE with nothing done."""
    await started(cluster, 3)
    storage = cluster.storage(0, write=3, ack=2)
    ledger = await ManagedLedger.open(NAME, store, storage, SMALL)
    for payload in SENT[:5]:
        await ledger.append(payload)
    await cluster.stop(2)
    for payload in SENT[5:]:
        await ledger.append(payload)
    await cluster.start(2)
    census = cluster.census()
    infos = [i for i in closed(ledger) if len(i.replicas) == 3]
    behind = [i for i in infos if cluster.holds(2, NAME, i.id) < (i.entries or 0)]
    assert behind and all(census.wanted(i, 3) == 0 for i in infos)
    version = await store.get(metadata_key(NAME))
    assert version is not None

    outcomes = {i.id: await repair(ledger, i, census, storage.nodes) for i in infos}

    for info in infos:
        expected = Outcome.REPAIRED if info in behind else Outcome.WHOLE
        assert outcomes[info.id] is expected, info.id
        assert cluster.holds(2, NAME, info.id) == info.entries
    after = await store.get(metadata_key(NAME))
    assert after is not None and after.version == version.version  # nothing recorded
    assert await repair(ledger, behind[0], census, storage.nodes) is Outcome.WHOLE
    await ledger.close()


async def test_a_ledger_made_on_too_few_nodes_is_widened_once_enough_are_alive(
    store: MetadataStore, cluster: Cluster
) -> None:
    await started(cluster, 3)
    await cluster.stop(2)
    storage = cluster.storage(0, write=3, ack=2)
    ledger = await written(store, storage)
    infos = closed(ledger)
    assert all(len(i.replicas) == 2 for i in infos)
    assert cluster.census().wanted(infos[0], 3) == 0  # no third node to copy to yet
    await cluster.start(2)
    census = cluster.census()
    assert all(census.wanted(i, 3) == 1 for i in infos)

    for info in infos:
        assert await repair(ledger, info, census, storage.nodes) is Outcome.REPAIRED

    after = await stored(store)
    for info in infos:
        assert sorted(Member.parse(m).broker for m in after[info.id].replicas) == ["b0", "b1", "b2"]
        assert cluster.holds(2, NAME, info.id) == info.entries
    await ledger.close()


async def test_a_copy_that_fell_behind_is_topped_up_and_a_lost_file_is_replaced(
    store: MetadataStore, cluster: Cluster
) -> None:
    """b2 holds part of a closed ledger (its file cut short by hand, like a replica that
    fell out of the ensemble while the ledger was written) and b1 lost the file: b2 is
    topped up from b0, and a new copy is made in b1's place (on b3, or on b1 again)."""
    await started(cluster, 4)
    await cluster.stop(3)
    storage = cluster.storage(0, write=3, ack=2)
    ledger = await written(store, storage)
    await cluster.start(3)
    info = closed(ledger)[0]
    assert info.entries is not None and info.entries >= 2
    b2 = cluster.servers[2].node
    b2.delete(NAME, info.id)
    b2.create(NAME, info.id)
    b2.append(NAME, info.id, 0, [SENT[0]], True)
    cluster.servers[1].node.delete(NAME, info.id)

    outcome = await repair(ledger, info, cluster.census(), storage.nodes)

    assert outcome is Outcome.REPAIRED
    assert cluster.holds(2, NAME, info.id) == info.entries
    brokers = [Member.parse(m).broker for m in (await stored(store))[info.id].replicas]
    assert brokers[:2] == ["b0", "b2"] and brokers[2] in ("b1", "b3")
    assert cluster.holds(int(brokers[2][1:]), NAME, info.id) == info.entries
    await ledger.close()


async def test_an_unregistered_broker_counts_as_lost_only_once_it_is_gone_for_good(
    store: MetadataStore, cluster: Cluster
) -> None:
    await started(cluster, 4)
    await cluster.stop(3)
    storage = cluster.storage(0, write=3, ack=2)
    ledger = await written(store, storage)
    await cluster.start(3)
    await cluster.stop(2)
    info = closed(ledger)[0]
    assert cluster.census().wanted(info, 3) == 0  # b2 is away: it may come back
    gone = cluster.census(gone=["b2"])
    assert gone.wanted(info, 3) == 1

    assert await repair(ledger, info, gone, storage.nodes) is Outcome.REPAIRED

    replicas = (await stored(store))[info.id].replicas
    assert sorted(Member.parse(m).broker for m in replicas) == ["b0", "b1", "b3"]
    await ledger.close()


async def test_with_no_node_to_copy_to_nothing_changes(
    store: MetadataStore, cluster: Cluster
) -> None:
    await started(cluster, 3)
    storage = cluster.storage(0, write=3, ack=2)
    ledger = await written(store, storage)
    await cluster.restart(1, wipe=True)
    info = closed(ledger)[0]
    census = only_target(cluster.census(), cluster.servers[0].member)  # b0 holds it already
    assert census.wanted(info, 3) == 0
    before = await stored(store)

    assert await repair(ledger, info, census, storage.nodes) is Outcome.NOT_NOW

    assert await stored(store) == before
    await ledger.close()


# ----------------------------------------------------------------- races


async def test_a_repair_racing_another_owners_recovery_loses_and_its_copy_is_swept(
    store: MetadataStore, cluster: Cluster
) -> None:
    """While the repair copies to b3, another broker takes the topic over (its recovery
    fences this owner): the repair records nothing, and b3's copy, which no placement
    names, is removed by b3's sweep."""
    await started(cluster, 4)
    await cluster.stop(3)
    storage = cluster.storage(0, write=3, ack=2)
    ledger = await written(store, storage)
    await cluster.start(3)
    await cluster.restart(1, wipe=True)
    b3 = cluster.servers[3].member
    gated = GatedNodes(cluster.nodes(0), held=b3)
    info = closed(ledger)[0]
    repairing = asyncio.create_task(
        repair(ledger, info, only_target(cluster.census(), b3), gated), name="repair"
    )
    await asyncio.wait_for(gated.copying.wait(), 10)

    new_owner = await ManagedLedger.open(NAME, store, cluster.storage(2, write=3, ack=2), SMALL)
    gated.release.set()
    assert await asyncio.wait_for(repairing, 10) is Outcome.LOST_RACE

    assert (await stored(store))[info.id].replicas == info.replicas  # as it was
    assert cluster.holds(3, NAME, info.id) == info.entries  # the loser's copy is there
    assert await payloads_of(new_owner) == SENT
    assert await sweep(cluster.servers[0].node, store, cluster.servers[0].member, grace_s=0) == []
    removed = await sweep(cluster.servers[3].node, store, b3, grace_s=0)
    assert removed == [(NAME, info.id)]
    assert cluster.holds(3, NAME, info.id) == 0
    assert await payloads_of(new_owner) == SENT  # (nothing it needs was removed)
    await new_owner.close()
    # the repair's placement move met the fence: proof of another owner, which stopped
    # the ledger (its close records no clean close, for the new owner's recovery to judge)
    with pytest.raises(WriteFailed) as refused:
        await ledger.append(b"refused")
    assert refused.value.retriable
    assert await ledger.close() is False


async def test_a_repair_racing_the_owners_trim_loses_cleanly(
    store: MetadataStore, cluster: Cluster
) -> None:
    await started(cluster, 4)
    await cluster.stop(3)
    storage = cluster.storage(0, write=3, ack=2)
    ledger = await written(store, storage)
    await cluster.start(3)
    await cluster.restart(1, wipe=True)
    b3 = cluster.servers[3].member
    gated = GatedNodes(cluster.nodes(0), held=b3)
    info = closed(ledger)[0]
    repairing = asyncio.create_task(
        repair(ledger, info, only_target(cluster.census(), b3), gated), name="repair"
    )
    await asyncio.wait_for(gated.copying.wait(), 10)

    trimmed = await ledger.trim(RetentionPolicy(retention_time_s=1), now_s=time.time() + 60)
    assert info.id in trimmed.ledgers
    gated.release.set()
    assert await asyncio.wait_for(repairing, 10) is Outcome.LOST_RACE

    assert info.id not in await stored(store)
    await ledger.append(b"still the owner")
    assert await sweep(cluster.servers[3].node, store, b3, grace_s=0) == [(NAME, info.id)]
    await ledger.close()


async def test_a_repair_and_the_owners_rollovers_both_land(
    store: MetadataStore, cluster: Cluster
) -> None:
    """The repair's placement change is one more compare-and-set in the owner's order:
    rollovers made while it copies neither fail it nor are fenced by it."""
    await started(cluster, 4)
    await cluster.stop(3)
    storage = cluster.storage(0, write=3, ack=2)
    ledger = await written(store, storage)
    await cluster.start(3)
    await cluster.restart(1, wipe=True)
    b3 = cluster.servers[3].member
    gated = GatedNodes(cluster.nodes(0), held=b3)
    info = closed(ledger)[0]
    repairing = asyncio.create_task(
        repair(ledger, info, only_target(cluster.census(), b3), gated), name="repair"
    )
    await asyncio.wait_for(gated.copying.wait(), 10)
    before = len(ledger.ledgers)
    more = [f"more-{i}".encode() * 8 for i in range(10)]
    for payload in more:
        await ledger.append(payload)
    assert len(ledger.ledgers) > before  # it rolled over meanwhile

    gated.release.set()
    assert await asyncio.wait_for(repairing, 10) is Outcome.REPAIRED

    assert str(b3) in (await stored(store))[info.id].replicas
    await ledger.append(b"last")
    assert await payloads_of(ledger) == [*SENT, *more, b"last"]
    await ledger.close()
