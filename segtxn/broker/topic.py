"""A topic (or range segment) served by this broker: its ledger, producers, subscriptions.

Publishing is one ledger append per message, after de-duplication, in each producer's send
order (segtxn/broker/publishing.py). Subscriptions are the ledger's durable cursors; each gets
a dispatcher when its first consumer attaches (and keeps it until the topic is unloaded).
"""

from __future__ import annotations

import asyncio
import logging

from segtxn.broker.arguments import changed_properties, check_properties
from segtxn.broker.dedup import Deduplication
from segtxn.broker.dedup_snapshots import SnapshotFenced
from segtxn.broker.delivery import ConsumerLink
from segtxn.broker.dispatch import Subscription
from segtxn.broker.members import SubscriptionType
from segtxn.broker.metrics import BrokerMetrics
from segtxn.broker.ordering import Turn
from segtxn.broker.publishing import Outcome, Publishing
from segtxn.broker.settings import UNORDERED_REDELIVERY, BrokerSettings
from segtxn.broker.txn.buffer import MetadataTransactionBuffer
from segtxn.broker.txn.buffer_records import delete_records
from segtxn.broker.txn.headers import HeaderCache
from segtxn.broker.txn.markers import MarkerTransactionBuffer
from segtxn.broker.txn.oprecords import OpRecordWriter
from segtxn.broker.txn.pending_ack_log import MLPendingAckStore, delete_log, pending_ack_log
from segtxn.broker.txn.pending_ack_records import MetadataPendingAckStore
from segtxn.broker.txn.snapshots import SnapshotLogs
from segtxn.broker.txn.v4checks import V4TransactionChecks
from segtxn.broker.txn.visibility import NoTransactions, TransactionBuffer
from segtxn.ledger import (
    LedgerClosed,
    LogStorage,
    ManagedLedger,
    Position,
    TrimResult,
    check_deletable,
)
from segtxn.metastore import MetadataStore
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.frames import Send
from segtxn.protocol.names import Domain, TopicName

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
        self._v4 = v4
        self._storage = storage
        self.ledger = ledger
        self.dedup = dedup
        self.settings = settings
        self.buffer = buffer
        self._store = store
        self._headers = headers
        self._metrics = metrics
        self._ops = ops
        self.subscriptions: dict[str, Subscription] = {}
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
        self._sub_lock = asyncio.Lock()
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
        consumer attached)."""
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
            if topic is not None:
                for subscription in topic.subscriptions.values():
                    await subscription.close()
            await buffer.close()
            await ledger.close()
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
        """The subscription ``name``, created (durably) if it does not exist.

        Raises:
            ServerError: ServiceNotReady, the topic is let go (:meth:`check_serving`),
                before or while the subscription was made (then it is closed again).
        """
        async with self._sub_lock:
            return await self._loaded_subscription(name, initial)

    async def existing_subscription(self, name: str) -> Subscription | None:
        """The subscription ``name``, loaded if need be, or None if it does not exist (is
        not made). A v4 decision's end for a subscription deleted since has nothing to
        apply: asked while the deletion ran, it waited for the lock and then made the
        subscription anew, empty, at the latest message.

        Raises:
            ServerError: as :meth:`subscription`.
        """
        async with self._sub_lock:
            if name not in self.ledger.cursors:
                return None
            return await self._loaded_subscription(name, "latest")

    async def _loaded_subscription(self, name: str, initial: str) -> Subscription:
        """(Under the subscriptions' lock.) :meth:`subscription`'s body."""
        self.check_serving()
        existing = self.subscriptions.get(name)
        if existing is not None:
            return existing
        try:
            subscription = await self._make_subscription(name, initial)
        except LedgerClosed:
            self.check_serving()  # the ledger is closed because the topic is let go
            raise
        if self.leaving:  # let go while it was made: the close did not see it
            await subscription.close()
            self.check_serving()
        self.subscriptions[name] = subscription
        return subscription

    async def _make_subscription(self, name: str, initial: str) -> Subscription:
        """A new subscription ``name`` (its cursor made if need be), its pending acks
        recovered; not in :attr:`subscriptions` yet.

        A recovery that fails closes the subscription again (its dispatcher, and its v4
        pending-ack log if it got opened) before raising on: nothing holds them once the
        attempt is given up, so the next load opens the log afresh instead of finding its
        file held ("... is held by another writer") until the broker restarts.
        """
        cursor = await self.ledger.open_cursor(name, start=initial)
        subscription = Subscription(
            name,
            self.ledger,
            cursor,
            self.buffer,
            batch=self.settings.dispatch_batch,
            max_permits=self.settings.max_permits,
            hold_s=self.settings.consumer_hold_s if self.name.domain is Domain.SEGMENT else 0,
            rewinds=UNORDERED_REDELIVERY not in self.settings.test_bugs,
        )
        if self.name.domain is Domain.SEGMENT:
            subscription.pending_acks = MetadataPendingAckStore(
                str(self.name),
                name,
                cursor=cursor,
                ledger=self.ledger,
                store=self._store,
                headers=self._headers,
                release=subscription.release,
                metrics=self._metrics,
                ops=self._ops,
            )
        elif self.name.domain is Domain.PERSISTENT:
            subscription.pending_acks = MLPendingAckStore(
                str(self.name),
                name,
                cursor=cursor,
                store=self._store,
                storage=self._storage,
                settings=self.settings.ledger,
                release=subscription.release,
                checks=self._v4,
                compact_entries=self.settings.txn_log_compact_entries,
                metrics=self._metrics,
            )
        try:
            await subscription.pending_acks.recover()
        except BaseException:
            try:
                await subscription.close()
            except Exception as e:  # (the recovery's failure is the one to report)
                log.warning("%s: closing %r after its failed recovery: %s", self.name, name, e)
            raise
        return subscription

    def subscription_names(self) -> list[str]:
        return sorted(set(self.ledger.cursors) | set(self.subscriptions))

    async def attach(
        self, name: str, link: ConsumerLink, sub_type: SubscriptionType, initial: str
    ) -> Subscription:
        """Attach a consumer (it is sent ConsumerReady) to ``name``, created if new.

        Raises ServerError(ConsumerBusy; ServiceNotReady, the topic is let go meanwhile:
        :meth:`check_serving`)."""
        subscription = await self.subscription(name, initial=initial)
        self.check_serving()  # (no yield between this and the attach)
        subscription.attach(link, sub_type)
        return subscription

    async def delete_subscription(self, name: str) -> None:
        """Delete subscription ``name``: close it if it is loaded, delete its v4 pending-ack
        log whether it is loaded or not (:meth:`_pending_ack_logs`), then its cursor, last:
        a deletion that fails part-way leaves the cursor, and its retry (which finds the
        subscription unloaded by then) deletes what the failed one left.

        All of it under the lock a consumer attaching takes (:meth:`subscription`): one that
        loaded the subscription (unloaded by a reset) as the deletion awaited had its log
        and cursor deleted under it. A consumer attached first has the deletion refused
        (ConsumerBusy); one attaching later makes the subscription anew.

        Raises:
            ServerError: SubscriptionNotFound / ConsumerBusy.
            LedgerMismatch: a file of its log is not its own; nothing was changed.
            LedgerError, MetadataStoreError: a step failed; a retry goes on.
        """
        async with self._sub_lock:
            subscription = self._check_idle_subscription(name)
            for log_ in self._pending_ack_logs(name):
                await check_deletable(log_, self._store, self._storage)  # before it is closed
            if subscription is not None:
                await subscription.close()
                del self.subscriptions[name]
            for log_ in self._pending_ack_logs(name):
                await delete_log(log_, self._store, self._storage)
            await self.ledger.delete_cursor(name)

    def _check_idle_subscription(self, name: str) -> Subscription | None:
        """The subscription ``name`` if it is loaded (None if not), once checked to exist
        and to have no consumer.

        Raises:
            ServerError: SubscriptionNotFound / ConsumerBusy.
        """
        if name not in self.ledger.cursors:
            raise ServerError(ErrorName.SUBSCRIPTION_NOT_FOUND, f"{self.name} has no {name!r}")
        subscription = self.subscriptions.get(name)
        if subscription is not None and subscription.consumers:
            raise ServerError(ErrorName.CONSUMER_BUSY, f"subscription {name!r} has consumers")
        return subscription

    def _pending_ack_logs(self, *subscriptions: str) -> list[str]:
        """The v4 pending-ack logs of ``subscriptions`` (none given: of every one, loaded or
        not; a subscription keeps its cursor until its log is deleted), by their names, not
        from loaded subscriptions: a reset unloads one until a consumer attaches again, so
        does a deletion that failed after closing it, and the log its deletion (or its
        topic's) left was replayed by a subscription made again under the name (the old
        transactions' acks applied to the new cursor). None unless ``persistent://``."""
        if self.name.domain is not Domain.PERSISTENT:
            return []
        names = subscriptions or self.subscription_names()
        return [pending_ack_log(str(self.name), s) for s in names]

    async def reset_subscription(self, name: str, target: str | Position) -> None:
        """Move a subscription to ``earliest``, ``latest`` or a message id.

        Under the lock a consumer attaching takes (:meth:`subscription`): one attaching as
        the reset awaited the cursor's save was attached to the subscription the reset then
        closed, and received nothing more.

        Raises ServerError(SubscriptionNotFound / ConsumerBusy).
        """
        async with self._sub_lock:
            subscription = self._check_idle_subscription(name)
            cursor = self.ledger.cursors[name]
            if target == "earliest":
                await cursor.reset_to_earliest()
            elif target == "latest":
                await cursor.reset_to_latest()
            elif isinstance(target, Position):
                await cursor.seek(target)
            else:
                raise ServerError(ErrorName.INVALID_ARGUMENT, f"cannot reset to {target!r}")
            if subscription is not None:  # rebuild its dispatcher from the moved cursor
                await subscription.close()
                del self.subscriptions[name]

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
        for log_ in self._pending_ack_logs():
            await check_deletable(log_, self._store, self._storage)

    async def delete(self) -> None:
        """Delete the topic's data, subscriptions (with their v4 pending-ack logs, loaded
        or not: :meth:`_pending_ack_logs`), de-duplication state and its transaction
        buffer's records (a segment's) or snapshots (a v4 topic's).

        The subscriptions go under their lock, after a consumer's load of one in flight
        (which lets go of it, the topic leaving): it opened the log as it was deleted, and
        wrote it afresh, left to be replayed by the name's subscription on a new topic.

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
            async with self._sub_lock:  # after a load in flight, which then lets go of it
                logs = self._pending_ack_logs()  # (loaded subscriptions' or not)
                for subscription in list(self.subscriptions.values()):
                    await subscription.close()
                for log_ in logs:
                    await delete_log(log_, self._store, self._storage)
                self.subscriptions.clear()
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
        """Close what a failed :meth:`delete` may have left open, each part even if another
        fails (logged), the ledger last and always: it must let go of its files."""
        parts = [*(s.close for s in self.subscriptions.values()), self.buffer.close]
        for close in parts:
            try:
                await close()
            except Exception as e:
                log.warning("%s: closing after a failed delete: %s", self.name, e)
        await self.ledger.close()

    async def close(self) -> None:
        """Close its subscriptions, its transaction buffer, its publishing, take a last
        de-duplication snapshot, and close its ledger: always, and last, whatever a part
        before it raised (logged), since the ledger must let go of its files. A
        subscription whose pending-ack log failed to close (its clean-close write fenced)
        had left the ledger open: its writer task ran on, and the topic could not be
        loaded again in this process ("... is held by another writer"). Raises the first
        failure, once everything is closed."""
        self.leaving = True
        failure: Exception | None = None
        try:
            parts = [*(s.close for s in list(self.subscriptions.values())), self.buffer.close]
            for close in [*parts, self.publishing.settle]:
                try:
                    await close()
                except Exception as e:
                    log.warning("%s: closing a part failed: %s: %s", self.name, type(e).__name__, e)
                    failure = failure or e
            try:
                await self.dedup.snapshot()
            except SnapshotFenced as e:  # the topic is another broker's now: it writes it
                log.warning("%s: no final de-duplication snapshot: %s", self.name, e)
            except Exception:
                log.exception("%s: final de-duplication snapshot failed", self.name)
        finally:
            await self.ledger.close()
        if failure is not None:
            raise failure
