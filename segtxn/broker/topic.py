"""A topic (or range segment) served by this broker: its ledger, producers, subscriptions.

Publishing is one ledger append per message, after de-duplication, in each producer's send
order (segtxn/broker/publishing.py). Subscriptions are the ledger's durable cursors; each gets
a dispatcher when its first consumer attaches (and keeps it until the topic is unloaded):
the topic's registry of them, and the lock their changes take, are
segtxn/broker/subscriptions.py's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from segtxn.aio import SETTLE_S, settle
from segtxn.broker.arguments import changed_properties, check_properties
from segtxn.broker.dedup import Deduplication
from segtxn.broker.dedup_snapshots import SnapshotFenced
from segtxn.broker.delivery import ConsumerLink
from segtxn.broker.dispatch import Subscription
from segtxn.broker.members import SubscriptionType
from segtxn.broker.metrics import BrokerMetrics
from segtxn.broker.ordering import Turn
from segtxn.broker.publishing import Outcome, Publishing
from segtxn.broker.settings import BrokerSettings
from segtxn.broker.subscriptions import Subscriptions
from segtxn.broker.txn.buffer import MetadataTransactionBuffer
from segtxn.broker.txn.buffer_records import delete_records
from segtxn.broker.txn.headers import HeaderCache
from segtxn.broker.txn.markers import MarkerTransactionBuffer
from segtxn.broker.txn.oprecords import OpRecordWriter
from segtxn.broker.txn.snapshots import SnapshotLogs
from segtxn.broker.txn.v4checks import V4TransactionChecks
from segtxn.broker.txn.visibility import NoTransactions, TransactionBuffer
from segtxn.ledger import LogStorage, ManagedLedger, Position, TrimResult
from segtxn.metastore import MetadataStore, MetadataStoreError
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.frames import Send
from segtxn.protocol.names import Domain, TopicName
from segtxn.stopping import expected

log = logging.getLogger(__name__)

SYSTEM_PROPERTY_PREFIX = "__"


class Topic:
    def __init__(
        self,
        name: TopicName,
        ledger: ManagedLedger,
        dedup: Deduplication,
        settings: BrokerSettings,
        *,
        buffer: TransactionBuffer,
        store: MetadataStore,
        headers: HeaderCache,
        metrics: BrokerMetrics,
        ops: OpRecordWriter,
        storage: LogStorage,
        v4: V4TransactionChecks,
    ) -> None:
        self.name = name
        self.ledger = ledger
        self.dedup = dedup
        self.settings = settings
        self.buffer = buffer
        self._store = store
        self.registry = Subscriptions(
            name,
            ledger,
            buffer,
            settings,
            check_serving=self.check_serving,
            store=store,
            storage=storage,
            headers=headers,
            metrics=metrics,
            ops=ops,
            v4=v4,
        )
        """Its subscriptions, made, loaded, reset and deleted one at a time."""
        self.subscriptions = self.registry.loaded
        """The subscriptions loaded now, by name (the registry's, the same dict)."""
        self.producers: dict[str, object] = {}
        """Connected producer names -> their connection (a name is used by one at a time)."""
        dedup.connected = self.producers  # connected producers are never forgotten
        self.readers: set[ConsumerLink] = set()
        """Cursor-less readers reading it now."""
        self.idle_since: float | None = None
        """When (monotonic) it was last seen idle by the broker's sweep (None: in use)."""
        self.leaving = False
        """Set once the broker lets go of this instance (its clients are hung up on, then
        it is closed or deleted; it is out of the broker's topics already): from then on
        no client attaches to it (:meth:`check_serving`)."""
        self.publishing = Publishing(name, ledger, dedup, buffer, settings.max_message_bytes)
        self.counters = self.publishing.counters
        self._properties_lock = asyncio.Lock()
        """Property changes one at a time: the limits hold on the set each one writes."""

    @classmethod
    async def load(
        cls,
        name: TopicName,
        *,
        store: MetadataStore,
        storage: LogStorage,
        settings: BrokerSettings,
        headers: HeaderCache,
        metrics: BrokerMetrics,
        ops: OpRecordWriter,
        snapshots: SnapshotLogs,
        v4: V4TransactionChecks,
    ) -> Topic:
        """Open the ledger, recover de-duplication and transaction state, and restore
        every subscription (so pending transactional acks materialize even with no
        consumer attached).

        A failure part-way closes what was opened (each subscription loaded, the
        transaction buffer, the ledger last and always: :func:`_close_parts`) and raises on,
        so that the next load opens the ledger afresh."""
        ledger = await ManagedLedger.open(str(name), store, storage, settings.ledger)
        buffer: TransactionBuffer
        if name.domain is Domain.SEGMENT:
            buffer = MetadataTransactionBuffer(
                str(name), ledger, store=store, headers=headers, metrics=metrics, ops=ops
            )
        elif name.domain is Domain.PERSISTENT:
            buffer = MarkerTransactionBuffer(
                str(name),
                name.tenant,
                name.namespace,
                ledger,
                snapshots=snapshots,
                checks=v4,
                store=store,
                snapshot_every=settings.txn_buffer_snapshot_every,
            )
        else:
            buffer = NoTransactions(ledger)
        topic: Topic | None = None
        try:
            dedup = Deduplication(
                str(name), store, settings.dedup_snapshot_every, expiry_s=settings.dedup_expiry_s
            )
            await dedup.recover(ledger)
            await buffer.recover()
            topic = cls(
                name,
                ledger,
                dedup,
                settings,
                buffer=buffer,
                store=store,
                headers=headers,
                metrics=metrics,
                ops=ops,
                storage=storage,
                v4=v4,
            )
            for cursor_name in list(ledger.cursors):
                await topic.subscription(cursor_name)
        except BaseException:
            loaded = [] if topic is None else list(topic.subscriptions.values())
            await _close_parts(
                name, "a failed load", [*(s.close for s in loaded), buffer.close], ledger
            )
            raise
        return topic

    # ------------------------------------------------------------------ publishing

    def turn(self, producer: str) -> Turn:
        """The next turn of ``producer``'s sends: take one per send, in the order the sends
        arrive (docs/protocol.md: producer order). See :class:`Publishing`."""
        return self.publishing.turn(producer)

    async def publish(self, producer: str, send: Send, turn: Turn) -> Outcome:
        """Store one message unless it is a duplicate: :meth:`Publishing.publish`."""
        return await self.publishing.publish(producer, send, turn)

    async def publish_plain(
        self, producer: str, sends: list[tuple[Send, Turn]]
    ) -> list[Outcome | ServerError]:
        """Store plain sends that arrived together: :meth:`Publishing.publish_plain`."""
        return await self.publishing.publish_plain(producer, sends)

    async def publish_txn(
        self, producer: str, sends: list[tuple[Send, Turn]]
    ) -> list[Outcome | ServerError]:
        """Store sends of one transaction that arrived together: :meth:`Publishing.publish_txn`."""
        return await self.publishing.publish_txn(producer, sends)

    # ------------------------------------------------------------------ subscriptions

    def check_serving(self) -> None:
        """Raise unless this instance is still served: a client that got it from the
        broker just before the broker let go of it (an unload, a move, a deletion) must
        not attach to it as it closes (it would wait for ever on a closed ledger), and is
        told to retry instead: it then finds the topic loaded again, or where it lives.

        Raises:
            ServerError: ServiceNotReady.
        """
        if self.leaving:
            raise ServerError(
                ErrorName.SERVICE_NOT_READY,
                f"{self.name} was let go by this broker (unloaded, moved or deleted) as the "
                "client connected; try again",
            )

    async def subscription(self, name: str, *, initial: str = "latest") -> Subscription:
        """The subscription ``name``, created if new: :meth:`Subscriptions.subscription`."""
        return await self.registry.subscription(name, initial=initial)

    async def existing_subscription(self, name: str) -> Subscription | None:
        """The subscription ``name`` if it exists: :meth:`Subscriptions.existing_subscription`."""
        return await self.registry.existing_subscription(name)

    def subscription_names(self) -> list[str]:
        """Every subscription's name, loaded or not."""
        return self.registry.subscription_names()

    async def attach(
        self, name: str, link: ConsumerLink, sub_type: SubscriptionType, initial: str
    ) -> Subscription:
        """Attach a consumer to ``name``, created if new: :meth:`Subscriptions.attach`."""
        return await self.registry.attach(name, link, sub_type, initial)

    async def delete_subscription(self, name: str) -> None:
        """Delete subscription ``name``: :meth:`Subscriptions.delete_subscription`."""
        await self.registry.delete_subscription(name)

    async def reset_subscription(self, name: str, target: str | Position) -> None:
        """Move subscription ``name``: :meth:`Subscriptions.reset_subscription`."""
        await self.registry.reset_subscription(name, target)

    # ------------------------------------------------------------------ retention

    async def trim(self, *, now_s: float | None = None) -> TrimResult:
        """Drop the ledgers the broker's retention policy lets go, and the transaction
        indexes over them (``now_s``: the time to judge ages by, for tests)."""
        result = await self.ledger.trim(self.settings.retention, now_s=now_s)
        if result.ledgers:
            await self.buffer.trimmed(result)
        return result

    # ------------------------------------------------------------------ properties

    @property
    def properties(self) -> dict[str, str]:
        return dict(self.ledger.properties)

    async def update_properties(self, updates: dict[str, str], removals: tuple[str, ...]) -> None:
        """Raises ServerError(NotAllowed) for system (``__``) properties, and
        ServerError(InvalidArgument) when the resulting set would break the limits."""
        for key in [*updates, *removals]:
            if key.startswith(SYSTEM_PROPERTY_PREFIX):
                raise ServerError(
                    ErrorName.NOT_ALLOWED,
                    f"{key[:40]!r} is a system property: it can be read, not set or removed",
                )
        async with self._properties_lock:
            check_properties(changed_properties(self.ledger.properties, updates, removals))
            await self.ledger.update_properties(updates, removals)

    # ------------------------------------------------------------------ stats

    async def disconnect_clients(self) -> None:
        """Hang up on every producer, consumer and reader (they reconnect and learn why:
        the topic loaded again, or gone). A reader too: its delivery stops at the closed
        ledger, and left connected it would wait for ever. From now on no client attaches
        (:attr:`leaving`)."""
        self.leaving = True
        for connection in list(self.producers.values()):
            close = getattr(connection, "close", None)
            if close is not None:
                await close(code=1001, message=b"topic unloaded")
        links = [link for s in self.subscriptions.values() for link in s.consumers]
        for link in [*links, *self.readers]:
            if link.disconnect is not None:
                await link.disconnect()

    def busy(self) -> bool:
        return bool(self.producers) or any(s.consumers for s in self.subscriptions.values())

    def idle(self) -> bool:
        """Sealed, no producer, consumer or reader, and no transaction in flight in it:
        nothing is lost by unloading it (it loads again on its next use, without making
        a new ledger, since it is sealed)."""
        return (
            self.ledger.is_sealed
            and not self.busy()
            and not self.readers
            and self.buffer.max_read_position == self.ledger.last_confirmed
        )

    async def check_deletable(self) -> None:
        """Check, changing nothing, that :meth:`delete` would not be refused for a file that
        is not the topic's: its ledger's and every subscription's (loaded or not) v4
        pending-ack log's (the files it deletes). A caller that hangs up on the topic's
        clients before deleting it checks first, so that a refusal leaves the topic served,
        its clients connected and every subscription's state (open transactions' acks) as
        it was.

        Raises:
            LedgerMismatch: naming the first foreign file found.
            MetadataStoreError: a pending-ack log's metadata could not be read.
        """
        await self.ledger.check_deletable()
        await self.registry.check_deletable()

    async def delete(self) -> None:
        """Delete the topic's data, subscriptions (with their v4 pending-ack logs, loaded
        or not: :meth:`Subscriptions.delete`), de-duplication state and its transaction
        buffer's records (a segment's) or snapshots (a v4 topic's).

        The subscriptions go under their lock, after a consumer's load of one in flight
        (which lets go of it, the topic leaving): :meth:`Subscriptions.delete`.

        A failure part-way (a store error deleting a pending-ack log, ...) raises on, and
        the topic is let go all the same: its subscriptions, transaction buffer and ledger
        are closed (:meth:`_close_after_failure`). Left open, its ledger's writer would
        hold the file's lock, and every later load of the topic would be refused ("held by
        another writer") until the broker restarted; closed, it loads again, to be served,
        or deleted by a retry (each step is idempotent: what was deleted stays so).

        Raises:
            MetadataStoreError, LedgerError: a step failed (the topic is closed).
        """
        self.leaving = True  # (no subscription is loaded from now on: check_serving)
        try:
            await self.registry.delete()  # after a load in flight, which then lets go of it
            await self.buffer.close()
            await self.publishing.settle()
        except BaseException:
            await self._close_after_failure()
            raise
        await self.ledger.delete()  # (closes the ledger first, even if it then fails)
        await self.dedup.delete()
        await self.buffer.deleted()
        if self.name.domain is Domain.SEGMENT:
            await delete_records(self._store, str(self.name))

    async def _close_after_failure(self) -> None:
        """Close what a failed :meth:`delete` may have left open: :func:`_close_parts`."""
        parts = [*(s.close for s in self.subscriptions.values()), self.buffer.close]
        await _close_parts(self.name, "a failed delete", parts, self.ledger)

    async def close(self) -> None:
        """Close its subscriptions, its transaction buffer, its publishing, take a last
        de-duplication snapshot (:data:`~segtxn.aio.SETTLE_S` at most: :meth:`_final_snapshot`),
        and close its ledger: always, and last, whatever a part
        before it raised (logged), since the ledger must let go of its files. A
        subscription whose pending-ack log failed to close (its clean-close write fenced)
        had left the ledger open: its writer task ran on, and the topic could not be
        loaded again in this process ("... is held by another writer"). Raises the first
        failure, once everything is closed.

        The subscriptions are closed after a consumer's load of one in flight, which lets
        go of it first (:meth:`Subscriptions.close`): left to go on, it opened the
        subscription's log after the topic was closed. A cancel that cut their close (the
        store silent past its grace) is raised once the buffer and the ledger are closed
        too (no final de-duplication snapshot then: a reload replays)."""
        self.leaving = True
        failure: Exception | None = None
        try:
            try:
                failure = await self.registry.close()  # after a load in flight, let go by it
            except asyncio.CancelledError:  # a close cut past its grace: the rest go on, in
                await self._close_buffer()  # the handler (sharing what is left of the grace)
                raise
            buffer_failure = await self._close_buffer()
            failure = failure or buffer_failure
            await self._final_snapshot()
        finally:
            await self.ledger.close()
        if failure is not None:
            raise failure

    async def _final_snapshot(self) -> None:
        """(:meth:`close`.) Take the last de-duplication snapshot, waiting
        :data:`~segtxn.aio.SETTLE_S` at most for it: past it, it is cancelled (:func:`settle`).
        Not written (that, or the store's failure), a reload replays from the last one
        written: logged at WARNING, not raised. A cancel of the close meanwhile cancels it
        too and is raised.

        Why the bound: awaited without one, a snapshot whose write the store never answered
        held the topic's close for ever. A broker's stop cancels its closes at its shutdown
        timeout, but nothing bounds an unload of one topic (a move, a drain) from above."""
        snapshot = asyncio.create_task(self.dedup.snapshot(), name=f"dedup-final-{self.name}")
        try:
            if not await settle(snapshot, SETTLE_S):
                log.warning(
                    "%s: no final de-duplication snapshot: not written within %.0f s; "
                    "cancelled (a reload replays from the last one written)", self.name, SETTLE_S,
                )  # fmt: skip
            elif not snapshot.cancelled():
                snapshot.result()  # (its failure: below)
        except SnapshotFenced as e:  # the topic is another broker's now: it writes it
            log.warning("%s: no final de-duplication snapshot: %s", self.name, e)
        except MetadataStoreError as e:  # (SnapshotOwnerUnknown too) the replay covers it
            log.warning(
                "%s: no final de-duplication snapshot (a reload replays from the last "
                "one written): %s: %s", self.name, type(e).__name__, e,
            )  # fmt: skip
        except Exception:
            log.exception("%s: final de-duplication snapshot failed", self.name)

    async def _close_buffer(self) -> Exception | None:
        """(:meth:`close`.) Close the transaction buffer, then settle publishing, each even
        if the other failed (logged); the first failure. Run after the subscriptions' close
        even when a cancel cut it: skipped then, the v4 checks kept the closed buffer as a
        participant of its open transactions, for their sweep to end them there."""
        failure: Exception | None = None
        for close in [self.buffer.close, self.publishing.settle]:
            try:
                await close()
            except Exception as e:
                log.warning("%s: closing a part failed: %s: %s", self.name, type(e).__name__, e)
                failure = failure or e
        return failure


async def _close_parts(
    name: TopicName,
    after: str,
    parts: Sequence[Callable[[], Awaitable[object]]],
    ledger: ManagedLedger,
) -> None:
    """Close what a failed load or delete (``after``) of the topic ``name`` left open: each
    of ``parts`` even if one before it failed, and ``ledger`` last and always, whatever they
    raised. Left open, the ledger's writer holds its file's lock, and every later load of
    the topic is refused ("... is held by another writer") until the broker restarts: a
    load that failed after loading a subscription whose close then failed (its pending-ack
    log's clean-close write refused) skipped the other parts' closes and the ledger's.

    Nothing is raised (each failure is logged at WARNING, with its traceback when it is
    not an error the store, a ledger or a server gives: a bug): the caller raises the
    failure that made it close the topic, the one to report. But a cancel: a part's close
    cut by one (its clean-close write past the cancel's grace, the store silent:
    :func:`~segtxn.aio.run_to_end`) raises it once the rest, the ledger last, are closed,
    in its handler, so that their writes share what is left of the grace. Only
    ``Exception`` was caught: a load cancelled (a broker's stop) skipped the ledger's close.

    Not a :class:`~segtxn.stopping.Stopping`: its time limit, once the store fails, would
    cancel a close part-way (a pending-ack log or the ledger left holding its file), while
    each close here ends on its own (a store call fails within its request timeout)."""
    for i, close in enumerate([*parts, ledger.close]):
        try:
            await close()
        except asyncio.CancelledError:
            if i < len(parts):  # (not the ledger's own close cut)
                await _close_parts(name, after, parts[i + 1 :], ledger)
            raise
        except Exception as e:
            log.warning(
                "%s: closing after %s: %s: %s", name, after, type(e).__name__, e,
                exc_info=not expected(e),
            )  # fmt: skip
