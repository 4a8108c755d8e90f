"""Storage nodes for replication tests: real nodes on real files behind real aiohttp servers.

A :class:`Cluster` holds ``n`` nodes (``b0``, ``b1``, ...), each a ``ReplicaNode`` in its own
directory served on a free loopback port. ``stop(i)`` takes a node's server down (its files
stay), ``start(i)`` brings it back on a new port, ``wipe(i)`` restarts it on an empty
directory (a new instance). ``storage(i, w, a)`` is the replicated storage a writer on
broker ``i`` uses, whose directory of nodes follows what is up; ``census()`` is what a
repairer sees of them (a node that is down counts as away, unless named ``gone``).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

from segtxn.ledger import FileLogStorage, ManagedLedger
from segtxn.ledger.metadata import LedgerSettings, tail_bound
from segtxn.ledger.replicas import (
    Census,
    HttpReplica,
    LocalReplica,
    Member,
    Replica,
    ReplicaNode,
    ReplicatedLogStorage,
    replica_routes,
)

TIMEOUT_S = 2.0


@dataclass
class NodeServer:
    broker: str
    root: Path
    node: ReplicaNode
    runner: web.AppRunner | None = None
    url: str = ""

    @property
    def member(self) -> Member:
        return Member(self.broker, self.node.instance)


@dataclass
class Cluster:
    root: Path
    session: aiohttp.ClientSession
    servers: list[NodeServer] = field(default_factory=list)

    async def add(self) -> NodeServer:
        broker = f"b{len(self.servers)}"
        root = self.root / broker
        server = NodeServer(broker, root, _node(root))
        self.servers.append(server)
        await self.start(len(self.servers) - 1)
        return server

    async def start(self, i: int) -> None:
        server = self.servers[i]
        app = web.Application(client_max_size=64 << 20)
        app.add_routes(replica_routes(server.node))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = runner.addresses[0][1]
        server.runner, server.url = runner, f"http://127.0.0.1:{port}"

    async def stop(self, i: int) -> None:
        server = self.servers[i]
        if server.runner is not None:
            await server.runner.cleanup()
            server.runner = None

    async def restart(self, i: int, *, wipe: bool = False) -> None:
        """Stop node ``i`` and start it again on its directory (emptied first: ``wipe``)."""
        await self.stop(i)
        server = self.servers[i]
        server.node.close()
        if wipe:
            shutil.rmtree(server.root)
        server.node = _node(server.root)
        await self.start(i)

    def nodes(self, i: int) -> TestNodes:
        return TestNodes(self, self.servers[i])

    def storage(self, i: int, *, write: int, ack: int) -> ReplicatedLogStorage:
        local = FileLogStorage(self.servers[i].root / "local")
        return ReplicatedLogStorage(self.nodes(i), local, write_quorum=write, ack_quorum=ack)

    def census(self, *, gone: Sequence[str] = ()) -> Census:
        up = [s for s in self.servers if s.runner is not None]
        return Census(
            registered={s.broker: s.node.instance for s in up},
            gone=frozenset(gone),
            targets=tuple(s.member for s in up),
        )

    def holds(self, i: int, name: str, ledger_id: int) -> int:
        """How many entries node ``i``'s replica of the ledger holds (0: none)."""
        node = self.servers[i].node
        if not node._files.exists(name, ledger_id):
            return 0
        count = 0
        while True:
            try:
                node.read(name, ledger_id, count, count)
            except IndexError:
                return count
            count += 1

    async def close(self) -> None:
        for i, server in enumerate(self.servers):
            await self.stop(i)
            server.node.close()


class TestNodes:
    """The product's ``Nodes`` contract over a :class:`Cluster`: alive = serving."""

    __test__ = False

    def __init__(self, cluster: Cluster, me: NodeServer) -> None:
        self._cluster = cluster
        self._me = me
        self.local: Member | None = me.member

    async def alive(self) -> list[Member]:
        return [s.member for s in self._cluster.servers if s.runner is not None]

    def replica(self, member: Member) -> Replica:
        if member == self._me.member:
            return LocalReplica(self._me.node, self._me.broker)
        return HttpReplica(member, self._locate, self._cluster.session, timeout_s=TIMEOUT_S)

    async def _locate(self, broker: str) -> str | None:
        for server in self._cluster.servers:
            if server.broker == broker and server.runner is not None:
                return server.url
        return None


def placement_members(replicas: Sequence[str]) -> list[str]:
    return [Member.parse(r).broker for r in replicas]


def _node(root: Path) -> ReplicaNode:
    return ReplicaNode(root / "replicas", tail_bytes=tail_bound(LedgerSettings()))


async def started(cluster: Cluster, n: int) -> Cluster:
    """``cluster`` with ``n`` more storage nodes running."""
    for _ in range(n):
        await cluster.add()
    return cluster


async def payloads_of(ledger: ManagedLedger) -> list[bytes]:
    """Every entry ``ledger`` holds, oldest first."""
    first = ledger.first_position() or ledger.next_write_position()
    return [e.payload for e in await ledger.read(first, max_entries=10_000)]
