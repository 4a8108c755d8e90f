"""A broker's part in replication: its storage node, the other brokers' as replicas, and
taking over the topics of a broker that died.

With ``--replication W/A`` every broker also runs a storage node (its replicas live under
``<data dir>/.replicas``, served at ``/replica/v1/`` next to its other routes) and registers
the node's instance with itself (``/brokers/<id>``). New ledgers are created on ``W`` live
brokers, this one first; an entry is acknowledged once ``A`` have synced it
(:mod:`segtxn.ledger.replicas`). Ledgers written before replication was turned on stay in
this broker's own files, served as before.

:class:`BrokerNodes` is the directory the replicated storage asks: the registered brokers
that have a storage node are the ones alive, and a broker's URL is looked up in the store
(kept for :data:`URL_TTL_S`, since a broker that restarts may come back elsewhere).

**Take-over.** A topic or segment whose home broker is not registered (its session
expired: it died, or is paused or cut off) and whose ledgers are all replicated is moved to
the live broker with the fewest homes (:func:`take_over`, one compare-and-set on its home
record), by whichever broker is asked for it first. The new home recovers the ledgers,
which fences the replicas: the old broker, if it comes back, can append nothing more, and
unloads what is no longer its own when it registers again.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from segtxn.auth import AuthSettings
from segtxn.broker.settings import BrokerSettings, Replication
from segtxn.ledger import LogStorage, movable, open_log_storage
from segtxn.ledger.metadata import tail_bound
from segtxn.ledger.replicas import (
    HttpReplica,
    LocalReplica,
    Member,
    Replica,
    ReplicaNode,
    ReplicatedLogStorage,
    ReplicaUnavailable,
)
from segtxn.metastore import MetadataStore, MetadataStoreError
from segtxn.protocol.names import TopicName
from segtxn.topics.catalog import Catalog, NoBrokers

URL_TTL_S = 5.0
LEDGER_IO_THREADS = 64
"""The event loop's default executor with replication: each replicated append, read or
recovery holds one of its threads for a network round trip (the managed ledger calls
storage from threads), and aiohttp resolves host names there too; the default
(cores + 4) would let a handful of slow replicas starve every other ledger."""
REPLICAS_DIR = ".replicas"


class BrokerNodes:
    """The storage nodes of the registered brokers (the ``Nodes`` a replicated storage
    uses)."""

    def __init__(
        self,
        catalog: Catalog,
        node: ReplicaNode,
        broker_id: str,
        timeout_s: float,
        auth: AuthSettings | None = None,
    ):
        self._catalog = catalog
        self.node = node
        self._broker_id = broker_id
        self.local: Member | None = Member(broker_id, node.instance)
        self._timeout_s = timeout_s
        self._auth = auth or AuthSettings()
        """Calls to other brokers' nodes go as the cluster role (and over TLS if on)."""
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[str, tuple[float, str | None]] = {}

    async def start(self) -> None:
        self._session = self._auth.cluster_session()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def alive(self) -> list[Member]:
        return [
            Member(b.broker_id, b.instance) for b in await self._catalog.brokers() if b.instance
        ]

    def replica(self, member: Member) -> Replica:
        if member == self.local:
            return LocalReplica(self.node, self._broker_id)
        if self._session is None:
            raise RuntimeError("BrokerNodes used before start()")
        return HttpReplica(member, self._locate, self._session, timeout_s=self._timeout_s)

    async def _locate(self, broker: str) -> str | None:
        """``broker``'s URL: from the store at most every :data:`URL_TTL_S`, and the last
        one known while the store does not answer (writes to replicas must not stop when
        the metadata store restarts).

        Raises:
            ReplicaUnavailable: the store does not answer and no URL is known yet.
        """
        now = time.monotonic()
        cached = self._urls.get(broker)
        if cached is not None and now - cached[0] < URL_TTL_S:
            return cached[1]
        try:
            url = await self._catalog.broker_url(broker)
        except MetadataStoreError as e:
            if cached is not None:
                return cached[1]
            raise ReplicaUnavailable(f"where broker {broker} is: {e}") from e
        self._urls[broker] = (now, url)
        return url


def open_storage(
    settings: BrokerSettings, catalog: Catalog
) -> tuple[LogStorage, BrokerNodes | None]:
    """The broker's ledger storage: its own files (or memory), or replicated over the
    brokers' storage nodes when ``settings.replication`` is set (then with its nodes)."""
    local = open_log_storage(settings.ledger_url)
    replication: Replication | None = settings.replication
    if replication is None:
        return local, None
    root = Path(urlsplit(settings.ledger_url).path) / REPLICAS_DIR
    node = ReplicaNode(root, tail_bytes=tail_bound(settings.ledger))
    nodes = BrokerNodes(
        catalog,
        node,
        settings.broker_id,
        replication.timeout_s,
        settings.auth,
    )
    storage = ReplicatedLogStorage(
        nodes,
        local,
        write_quorum=replication.write_quorum,
        ack_quorum=replication.ack_quorum,
    )
    return storage, nodes


async def take_over(
    catalog: Catalog, store: MetadataStore, name: TopicName, dead: str
) -> str | None:
    """Move ``name`` off ``dead`` (a broker that is not registered) if its ledgers are all
    replicated; returns its home afterwards (this move's or a racing one's), or None when
    it cannot move (a ledger lives on ``dead``'s disk alone, or no broker is alive)."""
    if not await movable(str(name), store):
        return None
    try:
        (target,) = await catalog.place(1)
    except NoBrokers:
        return None
    return await catalog.move_home(name, away_from=dead, to=target)


def widen_default_executor() -> None:
    """Give the running loop a default executor of :data:`LEDGER_IO_THREADS` threads."""
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(LEDGER_IO_THREADS, thread_name_prefix="ledger-io")
    )
