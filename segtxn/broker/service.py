"""The broker service: its store, session, registration, and the topics it serves.

A broker registers itself (``/brokers/<id>``, ephemeral, created only if no live broker
holds the id: :mod:`segtxn.broker.registration`) and serves the topics and segments whose
home it is (see :mod:`segtxn.topics.catalog`). A request for a topic homed elsewhere gets
``NotOwner`` with the home's URL (clients follow it); one homed on a broker that is down
gets ``ServiceNotReady``. Topics are loaded on first use, once (concurrent first uses share
the load).

If the broker's session expires (it was paused, or the store was unreachable, for a TTL),
or its record is deleted or overwritten behind its back, it is not ready and registers
again (on a new session, in the first case). Until it holds its id again it is *fenced*
(:mod:`segtxn.broker.fencing`): it loads nothing, accepts no new client and sends no
receipt; if another live process holds its id it lets go of its topics. Once registered
again it keeps the topics still provably its own (their clients stay connected) and lets
go of those taken over meanwhile (with replication another broker may take them; without
it nobody else can serve them: their data is on this broker's disk).

**Refused topics.** A topic or segment whose ledger is damaged where a crash cannot explain
it, or whose ledger files are missing, is refused (``PersistenceError`` naming the file),
never served partially or recreated empty, and logged at ERROR (once per reason). At
start-up the broker checks that every ledger the store says it holds has its file, and
that the file is that ledger's (not another cluster's): an empty or wrong data directory
makes it *not ready* (``/readyz`` answers 503 with the reason and the refused topics)
while it goes on serving the others. A refused topic is tried
again on its next use (restored files are served).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time

from segtxn.broker import (
    datacheck,
    deletemark,
    fencing,
    gauges,
    handoff,
    intake,
    publish_budget,
    refusals,
    replication,
    retire,
    unloading,
    upkeep,
)
from segtxn.broker.controllers import TopicControllers
from segtxn.broker.metrics import BrokerMetrics
from segtxn.broker.registration import Registration
from segtxn.broker.settings import BrokerSettings
from segtxn.broker.topic import Topic
from segtxn.broker.txn import snapshots, v4checks
from segtxn.broker.txn.headers import HeaderCache
from segtxn.broker.txn.oprecords import OpRecordWriter
from segtxn.ledger import (
    LedgerCorrupted,
    LedgerError,
    LogStorage,
    Position,
    WriteFailed,
)
from segtxn.ledger.replicas import ReplicatedLogStorage, widen_default_executor
from segtxn.metastore import (
    BadVersion,
    MetadataStore,
    MetadataStoreError,
    NotFound,
    Session,
    StoreSettings,
    open_store,
    wait_reachable,
)
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.names import Domain, TopicName
from segtxn.stopping import Stopping
from segtxn.topics.catalog import Catalog, TopicExists

log = logging.getLogger(__name__)


class BrokerService:
    def __init__(self, settings: BrokerSettings, store: MetadataStore | None = None) -> None:
        """``store``: use this store instead of opening ``settings.store_url`` (the caller
        then owns it: tests inject faults this way)."""
        self.settings = settings
        self._owns_store = store is None
        if store is None:
            tls_and_user = StoreSettings(credentials=settings.store_credentials)
            store = open_store(settings.store_url, tls_and_user)
        self.store: MetadataStore = store
        self.catalog = Catalog(self.store)
        self.storage: LogStorage
        self.storage, self.replica_nodes = replication.open_storage(settings, self.catalog)
        """``replica_nodes``: this broker's storage node and the others' (None: replication
        is off)."""
        self.repairer: replication.Repairer | None = None
        self.topics: dict[TopicName, Topic] = {}
        self._loading: dict[TopicName, asyncio.Task[Topic]] = {}
        self.dropping: set[asyncio.Task[None]] = set()
        """Topics being unloaded because their ledger stopped taking appends."""
        self.moving: set[TopicName] = set()
        """Topics being handed to another broker (a drain): clients are told to retry."""
        self.unloads = unloading.UnloadGuard()
        """Topics being unloaded (:mod:`segtxn.broker.unloading`): clients are told to
        retry, and a load in flight is let go."""
        self.registration = Registration(
            self.catalog,
            settings.broker_id,
            settings.advertise_url,
            instance=self.replica_nodes.node.instance if self.replica_nodes else "",
        )
        self.refused: dict[TopicName, LedgerCorrupted] = {}
        """Topics and segments this broker refuses to serve (their data is damaged or
        missing), and why; cleared when one loads again."""
        self.load_refusals = refusals.LoadRefusals()
        """How loudly each topic's refused load is logged (once, then DEBUG)."""
        self.fenced: str | None = None
        """Why the broker does not hold its id and its topics (None: it does, if its
        registration is held now): set when it loses either, cleared once it has claimed
        its id again and checked its topics (:mod:`segtxn.broker.fencing`)."""
        self._session: Session | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._upkeep: asyncio.Task[None] | None = None
        self._repair: asyncio.Task[None] | None = None
        self._stopped = False
        self.ready = asyncio.Event()
        self.metrics = BrokerMetrics()
        self.headers = HeaderCache(
            self.store, settings.header_watch, self.metrics.txn_header_events
        )
        self.op_records = OpRecordWriter(
            self.store, self.metrics, self.headers, lambda: self.publish_budget.full
        )
        self.intake = intake.Intake()
        """Who publishes here: one producer alone has its batches published in runs
        (:mod:`segtxn.broker.intake`)."""
        self.publish_budget = publish_budget.PublishBudget(
            settings.max_publish_buffer_bytes,
            self.metrics.publish_buffer_waits,
            on_wait=self.op_records.hurry,
        )
        """The payload bytes of sends read from producers and not yet answered, bounded over
        all connections (:mod:`segtxn.broker.publish_budget`)."""
        self.snapshots = snapshots.SnapshotLogs(
            settings.broker_id,
            self.store,
            self.storage,
            settings.ledger,
            compact_entries=settings.txn_log_compact_entries,
            metrics=self.metrics,
        )
        self.v4_checks = v4checks.V4TransactionChecks(
            self.store, settings.v4_txns, self.metrics, settings.auth
        )
        """Checks the v4 transactions sends and acks name; ends abandoned ones."""
        if self.replica_nodes is not None and settings.replication is not None:
            self.repairer = replication.Repairer(
                self,
                self.replica_nodes,
                write_quorum=settings.replication.write_quorum,
                settings=settings.repair,
            )
        self.controllers = TopicControllers(
            self.store,
            self.catalog,
            advertise_url=settings.advertise_url,
            sweep_s=settings.controller_sweep_s,
            session=self.session,
            metrics=self.metrics,
        )
        gauges.register(self)

    def session(self) -> Session:
        if self._session is None:
            raise ServerError(ErrorName.SERVICE_NOT_READY, "the broker is not registered yet")
        return self._session

    @property
    def broker_id(self) -> str:
        return self.settings.broker_id

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Reach the store (retrying up to ``store_timeout_s``), check the data directory,
        register. A failure or a cancellation half-way closes what was opened (the store
        too, when this service opened it) and raises on.

        Raises:
            StoreUnavailable: the store did not answer within ``store_timeout_s``.
            MetadataStoreError: another store failure during start-up.
        """
        try:
            await wait_reachable(
                self.store, timeout_s=self.settings.store_timeout_s, url=self.settings.store_url
            )
            if self.replica_nodes is not None:
                assert isinstance(self.storage, ReplicatedLogStorage)
                widen_default_executor()
                await self.storage.start()
                await self.replica_nodes.start()
            await self.headers.start()
            await self.v4_checks.start()
            await datacheck.check_data(self)
            await self.register(refuse=True)
        except BaseException:
            await self.stop()
            raise
        self._keeper = asyncio.create_task(
            fencing.keep_registered(self), name="broker-registration"
        )
        self._upkeep = asyncio.create_task(upkeep.run(self), name="broker-upkeep")
        if self.repairer is not None:
            self._repair = asyncio.create_task(self.repairer.run(), name="broker-repair")
        self.ready.set()

    def refuse(self, name: TopicName, error: LedgerCorrupted) -> str:
        """Note (and log, once per reason) that ``name`` is refused; returns why."""
        previous = self.refused.get(name)
        self.refused[name] = error
        why = str(error) if str(error).startswith(str(name)) else f"{name}: {error}"
        if previous is None or str(previous) != str(error):
            log.error("refusing to serve %s", why)
        return why

    @property
    def draining(self) -> bool:
        """Handing its topics off (:mod:`segtxn.broker.handoff`): nothing new comes here."""
        return self.registration.draining

    async def register(self, *, refuse: bool) -> None:
        """Open a session and claim the broker id on it (``refuse``: see
        :meth:`Registration.claim`; serving, topics are let go if another holds it)."""
        self._session = await self.store.open_session(self.settings.session_ttl_s)
        await self.registration.claim(
            self._session,
            refuse=refuse,
            taken=None if refuse else functools.partial(fencing.let_go_all, self),
        )

    async def set_draining(self, draining: bool) -> None:
        """Register as draining (nothing new is placed here) or not, now.

        Raises:
            ServerError(ServiceNotReady): the broker is not registered now (it registers
                again with this ``draining``: an undrain then is how a broker that lost its
                registration while draining comes back undrained, and its message says
                that the drain is stopped all the same).
        """
        self.registration.draining = draining
        try:
            await self.registration.update()
        except (NotFound, BadVersion) as e:
            why = self.registration.trouble or e
            message = f"broker {self.broker_id} is not registered now: {why}"
            if not draining:
                message += "; its drain is stopped all the same: it registers again undrained"
            raise ServerError(ErrorName.SERVICE_NOT_READY, message) from e

    async def stop(self) -> None:
        """Close everything :meth:`start` opened (safe after a partial start; idempotent).

        Each step runs whatever the ones before it raised, a failure logged once at
        WARNING (:mod:`segtxn.stopping`). The steps take as long as they need while the
        store answers (topics closing under load keep their clean state; the CLI's
        ``--shutdown-timeout`` bounds the whole), and share one stop's time from the first
        step the store failed (on the in-memory store too, which never keeps silent: a
        limit of the broker's own would only cut topics closing under load). Never raises
        but a cancellation. (A step that raised, its session's revocation refused or a
        snapshot log's close with the store down, was raised out of here and the later
        steps were skipped: the store this broker opened, its sessions' keep-alives and
        tasks, was left open.)

        Its background tasks (registration, upkeep, repair), topic loads and drops (a topic
        whose ledger stopped taking appends, closing) are cancelled first and waited for
        :data:`~segtxn.stopping.CANCELLED_END_S` at most (:meth:`Stopping.cancel`): a
        ledger change in flight ends within it, and a drop's close lets go of its ledger.
        Waited for without a bound (and a drop not even cancelled), one whose store write
        got no answer held the stop for ever, before any step: only the CLI's
        ``--shutdown-timeout`` cut it, and the topics, logs and store were never closed."""
        if self._stopped:
            return
        self._stopped = True
        self.ready.clear()
        log.info(
            "broker %s: stopping; closing %d topics and segments, %s and the store",
            self.broker_id,
            len(self.topics),
            "its session" if self._session is not None else "no session",
        )
        stopping = Stopping(f"broker {self.broker_id}", once_failing=True)
        await stopping.step("stopping its topic controllers", self.controllers.stop())
        background = [t for t in (self._keeper, self._upkeep, self._repair) if t is not None]
        await stopping.cancel(
            "its background tasks, topic loads and drops",
            [*background, *self._loading.values(), *self.dropping],
        )
        # no sweep writes a marker while topics close
        await self.v4_checks.stop(stopping)
        for topic in list(self.topics.values()):
            await stopping.step(f"closing {topic.name}", topic.close())
        self.topics.clear()
        await stopping.step("closing its snapshot logs", self.snapshots.close())
        await stopping.step("closing its op record writer", self.op_records.close())
        await stopping.step("closing its header cache", self.headers.close())
        if self.replica_nodes is not None:
            await stopping.step("closing its storage nodes", self.replica_nodes.close())
            self.replica_nodes.node.close()
        if self._session is not None:
            await stopping.step("closing its store session", self._session.close())
        if self._owns_store:
            await stopping.step("closing the store", self.store.close())
        log.info("broker %s: stopped", self.broker_id)

    # ------------------------------------------------------------------ topics

    async def serve(self, name: TopicName) -> Topic:
        """The loaded topic or segment ``name``, if this broker is its home.

        Raises:
            ServerError: TopicNotFound, NotOwner (with a redirect), ServiceNotReady (also
                while the broker is fenced: :mod:`segtxn.broker.fencing`), NotAllowed (a
                scalable topic is served through its segments), PersistenceError (its data
                is damaged or missing).
        """
        fencing.check(self)
        topic = self.topics.get(name)
        if topic is not None:
            return topic
        if name.domain is Domain.TOPIC:
            raise ServerError(
                ErrorName.NOT_ALLOWED,
                f"{name} is a scalable topic: produce and consume through its segments "
                "(the segtxn client does this for you)",
            )
        handoff.check_not_leaving(self, name)
        await self.check_home(name)
        handoff.check_not_leaving(self, name)  # it began to leave while the home was read
        topic = self.topics.get(name)  # loaded meanwhile by a call that read the home first:
        if topic is not None:  # a second load would serve the same subscriptions twice
            return topic
        loading = self._loading.get(name)
        if loading is None:
            loading = asyncio.create_task(self._load(name), name=f"load-{name}")
            self._loading[name] = loading
        return await asyncio.shield(loading)

    def is_loading(self, name: TopicName) -> bool:
        """Whether ``name`` is being loaded here now."""
        return name in self._loading

    def loading(self, name: TopicName) -> asyncio.Task[Topic] | None:
        """The load of ``name`` in flight here (None: none)."""
        return self._loading.get(name)

    async def check_home(self, name: TopicName) -> None:
        """Raise unless this broker is the home of ``name`` (creating it if allowed)."""
        home = await self.catalog.home_of(name)
        if home is None and name.domain is Domain.PERSISTENT and self.settings.auto_create_topics:
            try:
                home = await self.catalog.create_persistent(name)
            except TopicExists:
                home = await self.catalog.home_of(name)
        if home is None:
            raise ServerError(ErrorName.TOPIC_NOT_FOUND, f"topic {name} does not exist")
        if home == self.broker_id:
            return
        url = await self.owner_url(name, home)
        if url is None:
            raise ServerError(
                ErrorName.SERVICE_NOT_READY,
                f"{name} lives on broker {home!r}, which is down; it returns with it"
                if self.replica_nodes is None
                else f"{name}: its broker {home!r} is down and it cannot be taken over yet",
            )
        if url != self.settings.advertise_url:
            raise ServerError(ErrorName.NOT_OWNER, f"{name} is served by {url}", redirect=url)

    async def owner_url(self, name: TopicName, home: str) -> str | None:
        """The URL of the broker serving ``name``, whose home is ``home``: that broker's,
        or, if it is down and replication is on, that of the broker taking it over
        (:func:`replication.take_over`). None: no broker can serve it now."""
        url = await self.catalog.broker_url(home)
        if url is not None or self.replica_nodes is None:
            return url
        moved = await replication.take_over(self.catalog, self.store, name, home)
        return None if moved is None else await self.catalog.broker_url(moved)

    async def _load(self, name: TopicName) -> Topic:
        started = time.perf_counter()
        try:
            if name.domain is Domain.SEGMENT:
                await retire.check_not_retired(self.catalog, name)
            await deletemark.check_not_marked(self.catalog, name)
            topic = await Topic.load(
                name,
                store=self.store,
                storage=self.storage,
                settings=self.settings,
                headers=self.headers,
                metrics=self.metrics,
                ops=self.op_records,
                snapshots=self.snapshots,
                v4=self.v4_checks,
            )
            if self.replica_nodes is not None:  # it may have moved while it was loading
                await handoff.check_still_home(self, topic)
            refused = fencing.refusal(self)
            if refused is not None:  # fenced while it was loading
                await handoff.let_go(topic)
                raise refused
            await handoff.check_not_unloaded(self, topic)  # (no yield after it: see there)
        except LedgerCorrupted as e:
            raise ServerError(ErrorName.PERSISTENCE, self.refuse(name, e)) from e
        except LedgerError as e:  # a full disk, too few replicas (retriable): a WARNING each
            level = logging.WARNING if e.retriable else logging.ERROR  # client's retry
            log.log(level, "loading %s on broker %s failed: %s", name, self.broker_id, e)
            raise ServerError(ErrorName.SERVICE_NOT_READY, f"{name}: {e}") from e
        except ServerError as e:  # its client retries: a WARNING once, then DEBUG
            level = self.load_refusals.level(name, e)
            log.log(level, "loading %s on broker %s failed: %s", name, self.broker_id, e)
            raise
        except MetadataStoreError as e:
            log.warning("loading %s on broker %s failed: %s", name, self.broker_id, e)
            raise
        finally:
            self._loading.pop(name, None)
        self.load_refusals.forget(name)
        if self.refused.pop(name, None) is not None:
            log.warning("%s: its ledgers are whole again; serving it", name)
        self.topics[name] = topic
        # (told at once if it stopped while loading: a fence proven by a background save)
        topic.ledger.watch_write_failure(lambda e: handoff.write_failed(self, topic, e))
        last = topic.ledger.last_confirmed
        log.info(
            "loaded %s on broker %s: %s, %d subscriptions%s; took %.1f ms",
            name,
            self.broker_id,
            "empty" if last is None else f"last entry {last}",
            len(topic.subscriptions),
            ", sealed" if topic.ledger.is_sealed else "",
            (time.perf_counter() - started) * 1000,
        )
        return topic

    async def unload(self, name: TopicName) -> None:
        """Unload ``name`` if it is loaded or loading here (:func:`unloading.unload`): its
        clients are hung up on, then it is closed. Until it returns a client asking for
        ``name`` is told to retry, and a load in flight is let go, not served after it."""
        await unloading.unload(self, name)

    def is_unloading(self, name: TopicName) -> bool:
        """Whether ``name`` is being unloaded now (:attr:`unloads`)."""
        return name in self.unloads

    async def seal(self, name: TopicName) -> Position | None:
        """Terminate a persistent topic or a segment (idempotent): no more writes; reads
        and acks go on. Returns its last entry (None: it is empty).

        Raises:
            ServerError: as :meth:`serve`.
        """
        topic = await self.serve(name)
        already = topic.ledger.is_sealed
        try:
            last = await topic.ledger.terminate()
        except WriteFailed as e:  # (unloaded already if reopening may cure it)
            why = ErrorName.SERVICE_NOT_READY if e.retriable else ErrorName.PERSISTENCE
            raise ServerError(why, f"{name} cannot be sealed now: {e}") from e
        if not already:
            log.info(
                "sealed %s on broker %s: %s",
                name,
                self.broker_id,
                "empty" if last is None else f"last entry {last}",
            )
        return last
