"""A broker's part in replication: its storage node, the other brokers' as replicas,
taking over the topics of a broker that died, and repairing ledgers that lost copies.

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

**Repair** (:class:`Repairer`, one background task per broker: the shared loop of
:mod:`segtxn.topics.repairs`). Each broker repairs the closed ledgers of what it has open
(:mod:`segtxn.ledger.replicas.repair`: new copies, recorded by the owner's own
compare-and-set): the topics and segments it serves, their subscriptions' v4 pending-ack
logs and its namespaces' v4 snapshot logs. So no leader is needed and a repair never races
its ledger's owner on the same broker. It checks what it has loaded every ``check_s`` (in
memory, one listing of the brokers); it also reads the records of the topics homed here
but not loaded (and of the v4 logs loading them would open), and loads those that are
short of copies, every ``full_check_s`` and
whenever the registered storage nodes change (listed every ``members_check_s``: a broker
that came back on an empty disk is repaired for at once). At most ``max_copies`` ledgers
are copied at once. It also sweeps this broker's storage node every ``sweep_s``
(:mod:`segtxn.ledger.replicas.sweep`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from segtxn.auth import AuthSettings
from segtxn.broker import fencing
from segtxn.broker.settings import BrokerSettings
from segtxn.broker.txn.markers import CONTAINS_TXN
from segtxn.broker.txn.pending_ack_log import MLPendingAckStore, pending_ack_log
from segtxn.broker.txn.snapshots import snapshot_log
from segtxn.ledger import LedgerError, LogStorage, ManagedLedger, movable, open_log_storage
from segtxn.ledger.cursor import cursors_prefix
from segtxn.ledger.metadata import LedgerInfo, LedgerMetadata, decode, metadata_key, tail_bound
from segtxn.ledger.replicas import (
    Census,
    LocalReplica,
    Member,
    RepairSettings,
    ReplicaNode,
    ReplicatedLogStorage,
    Replication,
    sweep,
)
from segtxn.metastore import MetadataStore, MetadataStoreError
from segtxn.protocol.errors import ServerError
from segtxn.protocol.names import Domain, TopicName
from segtxn.topics.catalog import HOMES, HOMES_BY_BROKER, Catalog, NoBrokers
from segtxn.topics.nodes import CatalogNodes
from segtxn.topics.repairs import RepairLoop

if TYPE_CHECKING:
    from segtxn.broker.service import BrokerService

log = logging.getLogger(__name__)

REPLICAS_DIR = ".replicas"


class BrokerNodes(CatalogNodes):
    """The registered brokers' storage nodes, this broker's own among them (``node``)."""

    def __init__(
        self,
        catalog: Catalog,
        node: ReplicaNode,
        broker_id: str,
        timeout_s: float,
        auth: AuthSettings | None = None,
    ):
        """``auth``: calls to other brokers' nodes go as the cluster role (and over TLS
        when it is on)."""
        super().__init__(
            catalog,
            timeout_s,
            local=LocalReplica(node, broker_id),
            session=(auth or AuthSettings()).cluster_session,
        )
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


class Repairer(RepairLoop):
    """Repairs the closed ledgers of what ``service`` serves, and sweeps its storage node
    (see the module docstring). :meth:`run` is its one long-lived task."""

    def __init__(
        self,
        service: BrokerService,
        nodes: BrokerNodes,
        *,
        write_quorum: int,
        settings: RepairSettings,
    ) -> None:
        super().__init__(
            service.catalog,
            nodes,
            write_quorum=write_quorum,
            settings=settings,
            held=self._held,
            owner=f"broker {service.broker_id}",
            load_short=self._load_short,
        )
        self._service = service
        self._node = nodes.node
        service.metrics.gauge(
            "segtxn_broker_under_replicated_ledgers",
            "Closed ledgers of the topics served here (and of their v4 logs) with fewer live "
            "copies than the write quorum, or a copy found behind, at the last repair check",
            lambda: self.under_replicated,
        )

    async def run(self) -> None:
        """Check, repair and sweep until cancelled (a failed round is logged and retried)."""
        async with asyncio.TaskGroup() as group:
            group.create_task(super().run(), name="repair-loop")
            group.create_task(
                self.repeat("the replica sweep", self._sweep, self.settings.sweep_s),
                name="replica-sweep",
            )

    def _held(self) -> list[ManagedLedger]:
        """The ledgers of the topics and segments loaded here, of their subscriptions'
        pending-ack logs (opened once a subscription had a v4 ack), and of the namespaces'
        transaction-buffer snapshot logs opened here."""
        held: list[ManagedLedger] = []
        for topic in list(self._service.topics.values()):
            held.append(topic.ledger)
            for subscription in topic.subscriptions.values():
                acks = subscription.pending_acks
                if isinstance(acks, MLPendingAckStore) and acks.ledger is not None:
                    held.append(acks.ledger)
        held += [snapshot_log.ledger for snapshot_log in self._service.snapshots.opened()]
        return held

    async def _load_short(self, census: Census) -> None:
        """Load the topics homed here, not loaded, that have a ledger to repair: theirs,
        or one of the v4 logs loading them opens (their subscriptions' pending-ack logs,
        their namespace's snapshot log here when the topic has transactions)."""
        service = self._service
        if service.draining or fencing.why(service) is not None:
            return  # (fenced: nothing may be loaded, and the id may be another's)
        listing = await service.store.index_range(HOMES_BY_BROKER, service.broker_id)
        # a log open here is repaired where it is held; a snapshot log is read once
        seen: dict[str, bool] = dict.fromkeys((ledger.name for ledger in self._held()), False)
        for entry in listing.entries:
            name = TopicName.parse(unquote(entry.key[len(HOMES) :]))
            if name in service.topics:
                continue
            record = await service.store.get(metadata_key(str(name)))
            if record is None:
                continue
            meta = decode(record.value)
            short = self._short(meta.ledgers, census)
            for log_name in [] if short else await self._logs_opened_by_loading(name, meta):
                if log_name not in seen:
                    seen[log_name] = await self._log_short(log_name, census)
                if seen[log_name]:
                    short = True
                    break
            if not short:
                continue
            log.info("%s: loading it to repair its ledgers", name)
            try:
                await service.serve(name)
            except (ServerError, LedgerError, MetadataStoreError) as e:
                log.warning("%s: not loaded to repair it: %s", name, e)

    async def _logs_opened_by_loading(self, name: TopicName, meta: LedgerMetadata) -> list[str]:
        """The v4 logs loading ``name`` (whose ledger's record is ``meta``) opens, if they
        exist: the pending-ack log of each subscription, and the namespace's snapshot log
        here when the topic is known to have transactions (:mod:`.txn.markers`)."""
        if name.domain is not Domain.PERSISTENT:
            return []
        cursors = await self._service.store.list_prefix(cursors_prefix(str(name)))
        names = [
            pending_ack_log(str(name), unquote(record.key.rsplit("/", 1)[1]))
            for record in cursors.records
        ]
        if meta.properties.get(CONTAINS_TXN) not in (None, "false"):
            names.append(snapshot_log(name.tenant, name.namespace, self._service.broker_id))
        return names

    async def _log_short(self, log_name: str, census: Census) -> bool:
        """Whether the managed ledger ``log_name`` (not open here) has a closed ledger to
        repair now (False when it does not exist)."""
        record = await self._service.store.get(metadata_key(log_name))
        return record is not None and self._short(decode(record.value).ledgers, census)

    def _short(self, infos: Sequence[LedgerInfo], census: Census) -> bool:
        for info in infos:
            self.note_missing(info, census)
        return any(census.wanted(i, self._write_quorum) for i in infos)

    async def _sweep(self) -> None:
        member = Member(self._service.broker_id, self._node.instance)
        await sweep(self._node, self._service.store, member, grace_s=self.settings.sweep_grace_s)
