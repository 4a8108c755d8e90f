"""The empty replicas of a replicated create that failed are removed at the failure.

A replicated create makes the ledger's empty replica on each node it picks; when fewer than
the ack quorum took it (``NotEnoughReplicas``), or when the store refused the record that
was to name it, the replicas made were left until each node's sweep removed them, a grace
period later (an hour by default), and a create failing in a loop (a topic's load retried
while nodes refuse) piled them up. They are removed at the failure now, best effort (the
sweep stays the backstop), and only when no one else may use them: a node removes a
replica only for the create that made it (its claim), while it is still empty and no other
create has claimed it since (a create of an empty replica is idempotent, so another owner
may have made it its own).

Real components: ``ReplicaNode``s on real files behind real aiohttp servers
(tests/ledger/replicas.py), the in-memory store wrapped by the fault injector.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from segtxn.ledger import FileLogStorage, LedgerFenced, LedgerSettings, ManagedLedger
from segtxn.ledger.errors import LedgerMissing, NotEnoughReplicas
from segtxn.ledger.metadata import metadata_key
from segtxn.ledger.replicas import HttpReplica, Member, ReplicaNode
from segtxn.ledger.replicas.members import NO_CLAIM
from segtxn.ledger.replicas.wire import PREFIX
from segtxn.metastore import MetadataStore, open_store
from segtxn.metastore.faults import FaultInjector
from tests.ledger.replicas import TIMEOUT_S, Cluster, started
from tests.ledger.test_ledger_edges import faults

NAME = "persistent://t/n/failed-create"


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    async with open_store("memory://", wrap=FaultInjector) as s:
        yield s


def holds_replica(cluster: Cluster, i: int, ledger_id: int = 1) -> bool:
    return cluster.servers[i].node._files.exists(NAME, ledger_id)


@pytest.mark.parametrize("local_serves", [True, False], ids=["local-node", "remote-node"])
async def test_a_create_short_of_its_ack_quorum_removes_the_replicas_it_made(
    store: MetadataStore, cluster: Cluster, local_serves: bool
) -> None:
    """Two of the nodes alive refuse ledger 1 (a recovery fenced it there): one replica is
    made, on the writer's own node or, that one down, over HTTP on another, and the create
    fails short of its ack quorum of 2."""
    nodes = 3 if local_serves else 4
    await started(cluster, nodes)
    if not local_serves:
        await cluster.stop(0)
    for refusing in (nodes - 2, nodes - 1):
        with pytest.raises(LedgerMissing):  # (fenced all the same: a create is refused)
            cluster.servers[refusing].node.fence(NAME, 1)
    made = 0 if local_serves else 1
    storage = cluster.storage(0, write=3, ack=2)
    with pytest.raises(NotEnoughReplicas, match="needs at least 2 storage nodes"):
        await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    assert not holds_replica(cluster, made), "the failed create's replica is left"
    assert not any(holds_replica(cluster, i) for i in range(nodes))


async def test_a_first_create_the_store_refused_removes_its_replicas(
    store: MetadataStore, cluster: Cluster, tmp_path: Path
) -> None:
    await started(cluster, 3)
    held = faults(store).hold("txn", key_prefix=metadata_key(NAME), before=True)
    opening = asyncio.create_task(
        ManagedLedger.open(NAME, store, cluster.storage(0, write=3, ack=2), LedgerSettings())
    )
    await held.wait_for(1)  # its replicas made, its record on its way
    assert all(holds_replica(cluster, i) for i in range(3))
    winner = await ManagedLedger.open(NAME, store, FileLogStorage(tmp_path / "another"))
    await winner.close()  # (another owner, on its own storage, created the ledger first)
    held.release()
    with pytest.raises(LedgerFenced, match="created concurrently"):
        await opening
    assert not any(holds_replica(cluster, i) for i in range(3)), "its replicas are left"


def test_a_node_discards_a_replica_only_for_its_one_creator_while_it_is_empty(
    tmp_path: Path,
) -> None:
    node = ReplicaNode(tmp_path, tail_bytes=1 << 20)
    try:
        mine = node.create(NAME, 1)
        theirs = node.create(NAME, 1)  # another owner made it its own too (idempotent)
        assert not node.discard(NAME, 1, mine) and not node.discard(NAME, 1, theirs)
        assert node._files.exists(NAME, 1)

        written = node.create(NAME, 2)
        node.append(NAME, 2, 0, [b"an entry"], False)
        assert not node.discard(NAME, 2, written), "a replica with an entry was discarded"

        fenced = node.create(NAME, 3)
        node.fence(NAME, 3)  # a recovery uses it
        assert not node.discard(NAME, 3, fenced)

        alone = node.create(NAME, 4)
        assert not node.discard(NAME, 4, alone + 1)  # another claim
        assert node.discard(NAME, 4, alone)
        assert not node._files.exists(NAME, 4)
        assert not node.discard(NAME, 4, alone)  # (once)
    finally:
        node.close()


def test_a_replica_reopened_after_a_node_restart_is_never_discarded(tmp_path: Path) -> None:
    """A node that restarted does not know who made an empty replica it finds: another
    create of it may be another owner's, so no create's claim removes it."""
    node = ReplicaNode(tmp_path, tail_bytes=1 << 20)
    node.create(NAME, 1)
    node.close()
    node = ReplicaNode(tmp_path, tail_bytes=1 << 20)
    try:
        claim = node.create(NAME, 1)
        assert not node.discard(NAME, 1, claim)
        assert node._files.exists(NAME, 1)
    finally:
        node.close()


async def test_a_node_of_an_earlier_version_answers_a_create_with_no_claim(
    cluster: Cluster,
) -> None:
    """A node that answers a create without a claim (an earlier version, during a rolling
    upgrade) still takes the ledger (its create is not taken for a failure); its replica
    is never discarded, only swept."""

    async def create(request: web.Request) -> web.Response:
        return web.json_response({"count": 0})  # (what nodes answered before claims)

    app = web.Application()
    app.router.add_post(PREFIX + "create", create)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"

        async def locate(broker: str) -> str | None:
            return url

        replica = HttpReplica(Member("old", "i0"), locate, cluster.session, timeout_s=TIMEOUT_S)
        assert await replica.create(NAME, 1) == NO_CLAIM
    finally:
        await runner.cleanup()
