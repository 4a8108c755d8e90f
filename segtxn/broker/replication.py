"""A broker's part in replication: its storage node, the other brokers' as replicas, and
taking over the topics of a broker that died.

With ``--replication W/A`` every broker also runs a storage node (its replicas live under
``<data dir>/.replicas``, served at ``/replica/v1/`` next to its other routes) and registers
the node's instance with itself (``/brokers/<id>``). New ledgers are created on ``W`` live
brokers, this one first; an entry is acknowledged once ``A`` have synced it
(:mod:`segtxn.ledger.replicas`). Ledgers written before replication was turned on stay in
this broker's own files, served as before.

:class:`BrokerNodes` is the directory the replicated storage asks: the registered brokers
that have a storage node are the ones alive (:class:`~segtxn.topics.nodes.CatalogNodes`).

**Take-over.** A topic or segment whose home broker is not registered (its session
expired: it died, or is paused or cut off) and whose ledgers are all replicated is moved to
the live broker with the fewest homes (:func:`take_over`, one compare-and-set on its home
record), by whichever broker is asked for it first. The new home recovers the ledgers,
which fences the replicas: the old broker, if it comes back, can append nothing more, and
unloads what is no longer its own when it registers again.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from segtxn.broker.settings import BrokerSettings
from segtxn.ledger import LogStorage, movable, open_log_storage
from segtxn.ledger.metadata import tail_bound
from segtxn.ledger.replicas import (
    LocalReplica,
    ReplicaNode,
    ReplicatedLogStorage,
    Replication,
)
from segtxn.metastore import MetadataStore
from segtxn.protocol.names import TopicName
from segtxn.topics.catalog import Catalog, NoBrokers
from segtxn.topics.nodes import CatalogNodes

REPLICAS_DIR = ".replicas"


class BrokerNodes(CatalogNodes):
    """The registered brokers' storage nodes, this broker's own among them (``node``)."""

    def __init__(self, catalog: Catalog, node: ReplicaNode, broker_id: str, timeout_s: float):
        super().__init__(catalog, timeout_s, local=LocalReplica(node, broker_id))
        self.node = node


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
    nodes = BrokerNodes(catalog, node, settings.broker_id, replication.timeout_s)
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
