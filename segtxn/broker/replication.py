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

**Repair** (:class:`Repairer`, one background task per broker). Each broker repairs the
closed ledgers of the topics and segments it serves (:mod:`segtxn.ledger.replicas.repair`:
new copies, recorded by the owner's own compare-and-set), so no leader is needed and a
repair never races its ledger's owner on the same broker. It checks the topics it has
loaded every ``check_s`` (in memory, one listing of the brokers); it also reads the
records of the topics homed here but not loaded, and loads those that are short of
copies, every ``full_check_s`` and whenever the registered storage nodes change (listed
every ``members_check_s``: a broker that came back on an empty disk is repaired for at
once). At most ``max_copies`` ledgers are copied at once. It also sweeps this broker's
storage node every ``sweep_s`` (:mod:`segtxn.ledger.replicas.sweep`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from segtxn.auth import AuthSettings
from segtxn.broker.settings import BrokerSettings
from segtxn.ledger import LedgerError, LogStorage, movable, open_log_storage
from segtxn.ledger.metadata import LedgerInfo, decode, metadata_key, tail_bound
from segtxn.ledger.replicas import (
    Census,
    LocalReplica,
    Member,
    Outcome,
    RepairSettings,
    ReplicaNode,
    ReplicatedLogStorage,
    Replication,
    repair_ledger,
    sweep,
)
from segtxn.metastore import MetadataStore, MetadataStoreError
from segtxn.protocol.errors import ServerError
from segtxn.protocol.names import TopicName
from segtxn.topics.catalog import HOMES, HOMES_BY_BROKER, Catalog, NoBrokers
from segtxn.topics.nodes import CatalogNodes

if TYPE_CHECKING:
    from segtxn.broker.service import BrokerService
    from segtxn.broker.topic import Topic

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


class Repairer:
    """Repairs the closed ledgers of the topics ``service`` serves, and sweeps its storage
    node (see the module docstring). :meth:`run` is its one long-lived task."""

    def __init__(
        self,
        service: BrokerService,
        nodes: BrokerNodes,
        *,
        write_quorum: int,
        settings: RepairSettings,
    ) -> None:
        self._service = service
        self._nodes = nodes
        self._write_quorum = write_quorum
        self.settings = settings
        self._missing_since: dict[str, float] = {}
        """Brokers seen unregistered (a placement names them), since when (monotonic)."""
        self._seen: tuple[frozenset[tuple[str, str]], frozenset[str]] | None = None
        self._wake = asyncio.Event()
        self._full_due = True
        self._last_full = 0.0
        self._checking = asyncio.Lock()  # one round at a time: two would copy the same ledger
        self.under_replicated = 0
        """Closed ledgers of the topics served here with fewer than W copies on registered
        storage nodes, as of the last check (after its repairs)."""
        service.metrics.gauge(
            "segtxn_broker_under_replicated_ledgers",
            "Closed ledgers of the topics served here with fewer live copies than the write "
            "quorum, at the last repair check",
            lambda: self.under_replicated,
        )

    async def run(self) -> None:
        """Check, repair and sweep until cancelled (a failed round is logged and retried)."""
        async with asyncio.TaskGroup() as group:
            group.create_task(
                self._repeat("watching storage nodes", self._watch, self.settings.members_check_s),
                name="repair-members",
            )
            group.create_task(self._checks(), name="repair-checks")
            group.create_task(
                self._repeat("the replica sweep", self._sweep, self.settings.sweep_s),
                name="replica-sweep",
            )

    async def census(self) -> Census:
        """The storage nodes now (a broker's copies are lost once it has been seen
        unregistered for ``lost_after_s``)."""
        brokers = await self._service.catalog.brokers()
        registered = {b.broker_id: b.instance for b in brokers if b.instance}
        now = time.monotonic()
        for broker in registered:
            self._missing_since.pop(broker, None)
        if self._seen is not None:
            for broker, _ in self._seen[0]:
                if broker not in registered:
                    self._missing_since.setdefault(broker, now)
        lost_after = self.settings.lost_after_s
        return Census(
            registered=registered,
            gone=frozenset(b for b, t in self._missing_since.items() if now - t >= lost_after),
            targets=tuple(
                Member(b.broker_id, b.instance) for b in brokers if b.instance and not b.draining
            ),
        )

    async def check(self, *, full: bool) -> int:
        """One round: repair what is short among the topics loaded here (and, ``full``,
        load those homed here that are short first). Returns the ledgers repaired."""
        async with self._checking:
            return await self._check(full=full)

    async def _check(self, *, full: bool) -> int:
        census = await self.census()
        if full:
            self._last_full = time.monotonic()
            if not self._service.draining:
                await self._load_short(census)
        short = 0
        repairs: list[tuple[Topic, LedgerInfo]] = []
        for topic in list(self._service.topics.values()):
            for info in topic.ledger.ledgers:
                self._note_missing(info, census)
                short += census.short(info, self._write_quorum)
                if census.wanted(info, self._write_quorum):
                    repairs.append((topic, info))
        outcomes: list[Outcome] = []
        queue = iter(repairs)

        async def worker() -> None:  # (each takes the next repair from the shared queue)
            for topic, info in queue:
                outcomes.append(await self._repair(topic, info, census))

        async with asyncio.TaskGroup() as group:
            for n in range(min(self.settings.max_copies, len(repairs))):
                group.create_task(worker(), name=f"repair-worker-{n}")
        repaired = outcomes.count(Outcome.REPAIRED)
        self.under_replicated = max(0, short - repaired)
        return repaired

    async def _repair(self, topic: Topic, info: LedgerInfo, census: Census) -> Outcome:
        if self._service.topics.get(topic.name) is not topic or info not in topic.ledger.ledgers:
            return Outcome.LOST_RACE  # unloaded, or the ledger changed, meanwhile
        try:
            return await repair_ledger(
                topic.ledger,
                info,
                census,
                self._nodes,
                write_quorum=self._write_quorum,
                commit_within_s=self.settings.commit_within_s,
            )
        except (LedgerError, MetadataStoreError) as e:
            log.warning("ledger %d of %s: repair failed: %s", info.id, topic.name, e)
            return Outcome.NOT_NOW

    async def _load_short(self, census: Census) -> None:
        """Load the topics homed here, not loaded, that have a ledger to repair."""
        service = self._service
        listing = await service.store.index_range(HOMES_BY_BROKER, service.broker_id)
        for entry in listing.entries:
            name = TopicName.parse(unquote(entry.key[len(HOMES) :]))
            if name in service.topics:
                continue
            record = await service.store.get(metadata_key(str(name)))
            if record is None:
                continue
            infos = decode(record.value).ledgers
            for info in infos:
                self._note_missing(info, census)
            if not any(census.wanted(i, self._write_quorum) for i in infos):
                continue
            log.info("%s: loading it to repair its ledgers", name)
            try:
                await service.serve(name)
            except (ServerError, LedgerError, MetadataStoreError) as e:
                log.warning("%s: not loaded to repair it: %s", name, e)

    def _note_missing(self, info: LedgerInfo, census: Census) -> None:
        """Start the clock of the unregistered brokers ``info``'s copies are on."""
        now = time.monotonic()
        for member in map(Member.parse, info.replicas):
            if member.broker not in census.registered:
                self._missing_since.setdefault(member.broker, now)

    async def _watch(self) -> None:
        """Wake a full check when the registered storage nodes change (or one is gone)."""
        census = await self.census()
        seen = (frozenset(census.registered.items()), census.gone)
        if seen != self._seen:
            self._seen = seen
            self._full_due = True
            self._wake.set()

    async def _checks(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.check_s):
                    await self._wake.wait()
            self._wake.clear()
            due = time.monotonic() - self._last_full >= self.settings.full_check_s
            full, self._full_due = self._full_due or due, False
            await self._step("a repair check", functools.partial(self.check, full=full))

    async def _sweep(self) -> None:
        node = self._nodes.node
        member = Member(self._service.broker_id, node.instance)
        await sweep(node, self._service.store, member, grace_s=self.settings.sweep_grace_s)

    async def _repeat(
        self, what: str, step: Callable[[], Awaitable[object]], every_s: float
    ) -> None:
        while True:
            await asyncio.sleep(every_s)  # a schedule, not a wait
            await self._step(what, step)

    async def _step(self, what: str, step: Callable[[], Awaitable[object]]) -> None:
        try:
            await step()
        except MetadataStoreError as e:
            log.warning(
                "broker %s: %s: the store failed (%s); tried again later",
                self._service.broker_id,
                what,
                e,
            )
        except Exception:
            log.exception("broker %s: %s failed; tried again later", self._service.broker_id, what)
