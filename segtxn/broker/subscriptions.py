"""A topic's subscription registry: making, loading, attaching to, resetting and deleting
its subscriptions, one change at a time.

A subscription is a durable cursor of the topic's ledger; :class:`Subscriptions` loads it
(a :class:`~segtxn.broker.dispatch.Subscription`: its dispatcher, its pending acks
recovered, a ``persistent://`` one's v4 pending-ack log opened) when a consumer first
attaches, or when the topic loads, and keeps it loaded (:attr:`Subscriptions.loaded`) until
the topic is unloaded, or a reset unloads it until its next use.

**Why a lock.** Loading a subscription awaits (its cursor's record, its pending-ack log's
open and replay), and so do a reset, a deletion and a v4 decision's end
(``END_TXN_ON_SUBSCRIPTION``, :meth:`Subscriptions.existing_subscription`). Each of them
runs under the registry's one lock, which a consumer attaching takes too: without it, a
consumer that loaded a subscription (unloaded by a reset) as its deletion awaited had its
log and cursor deleted under it (91e79b4); one attaching as a reset awaited the cursor's
save was left on the subscription the reset then closed, receiving nothing (874f063); a
topic's deletion deleted a log a load was opening, which wrote it afresh, left behind the
deleted topic (23f0d0c); a topic's unload let a load go on, which opened its log after the
topic was closed, beside the instance loaded again meanwhile (:meth:`Subscriptions.close`);
and an end asked while the subscription was deleted made it again (aa5a850). A check ("it
exists", "no consumer") and the change it guards are never split by another's change.

The registry is the topic's: :class:`~segtxn.broker.topic.Topic` holds one and delegates its
subscription methods to it; the topic's ``leaving`` (its ``check_serving``) says when a
load must let go of what it made (the topic is being unloaded or deleted).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from segtxn.broker.delivery import ConsumerLink
from segtxn.broker.dispatch import Subscription
from segtxn.broker.members import SubscriptionType
from segtxn.broker.metrics import BrokerMetrics
from segtxn.broker.settings import UNORDERED_REDELIVERY, BrokerSettings
from segtxn.broker.txn.headers import HeaderCache
from segtxn.broker.txn.oprecords import OpRecordWriter
from segtxn.broker.txn.pending_ack_log import MLPendingAckStore, delete_log, pending_ack_log
from segtxn.broker.txn.pending_ack_records import MetadataPendingAckStore
from segtxn.broker.txn.v4checks import V4TransactionChecks
from segtxn.broker.txn.visibility import TransactionBuffer
from segtxn.ledger import LedgerClosed, LogStorage, ManagedLedger, Position, check_deletable
from segtxn.metastore import MetadataStore
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.names import Domain, TopicName

log = logging.getLogger(__name__)


class Subscriptions:
    """The subscriptions of the topic ``name`` (module docstring)."""

    def __init__(
        self,
        name: TopicName,
        ledger: ManagedLedger,
        buffer: TransactionBuffer,
        settings: BrokerSettings,
        *,
        check_serving: Callable[[], None],
        store: MetadataStore,
        storage: LogStorage,
        headers: HeaderCache,
        metrics: BrokerMetrics,
        ops: OpRecordWriter,
        v4: V4TransactionChecks,
    ) -> None:
        self.name = name
        self.ledger = ledger
        self.buffer = buffer
        self.settings = settings
        self._check_serving = check_serving
        self._store = store
        self._storage = storage
        self._headers = headers
        self._metrics = metrics
        self._ops = ops
        self._v4 = v4
        self.loaded: dict[str, Subscription] = {}
        """The subscriptions loaded now, by name (the topic's ``subscriptions``)."""
        self._lock = asyncio.Lock()
        """Held by each load, reset, deletion and end (module docstring)."""

    async def subscription(self, name: str, *, initial: str = "latest") -> Subscription:
        """The subscription ``name``, created (durably) if it does not exist.

        Raises:
            ServerError: ServiceNotReady, the topic is let go (its ``check_serving``),
                before or while the subscription was made (then it is closed again).
        """
        async with self._lock:
            return await self._loaded_subscription(name, initial)

    async def existing_subscription(self, name: str) -> Subscription | None:
        """The subscription ``name``, loaded if need be, or None if it does not exist (is
        not made). A v4 decision's end for a subscription deleted since has nothing to
        apply: asked while the deletion ran, it waited for the lock and then made the
        subscription anew, empty, at the latest message.

        Raises:
            ServerError: as :meth:`subscription`.
        """
        async with self._lock:
            if name not in self.ledger.cursors:
                return None
            return await self._loaded_subscription(name, "latest")

    async def _loaded_subscription(self, name: str, initial: str) -> Subscription:
        """(Under the subscriptions' lock.) :meth:`subscription`'s body."""
        self._check_serving()
        existing = self.loaded.get(name)
        if existing is not None:
            return existing
        try:
            subscription = await self._make_subscription(name, initial)
        except LedgerClosed:
            self._check_serving()  # the ledger is closed because the topic is let go
            raise
        try:
            self._check_serving()
        except ServerError:  # let go while it was made: the close did not see it
            await subscription.close()
            raise
        self.loaded[name] = subscription
        return subscription

    async def _make_subscription(self, name: str, initial: str) -> Subscription:
        """A new subscription ``name`` (its cursor made if need be), its pending acks
        recovered; not in :attr:`loaded` yet.

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
                topic_ledger=self.ledger,
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
        return sorted(set(self.ledger.cursors) | set(self.loaded))

    async def attach(
        self, name: str, link: ConsumerLink, sub_type: SubscriptionType, initial: str
    ) -> Subscription:
        """Attach a consumer (it is sent ConsumerReady) to ``name``, created if new.

        Raises ServerError(ConsumerBusy; ServiceNotReady, the topic is let go meanwhile:
        its ``check_serving``)."""
        subscription = await self.subscription(name, initial=initial)
        self._check_serving()  # (no yield between this and the attach)
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
        async with self._lock:
            subscription = self._check_idle_subscription(name)
            for log_ in self._pending_ack_logs(name):
                await check_deletable(log_, self._store, self._storage)  # before it is closed
            if subscription is not None:
                await subscription.close()
                del self.loaded[name]
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
        subscription = self.loaded.get(name)
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
        async with self._lock:
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
                del self.loaded[name]

    async def check_deletable(self) -> None:
        """Check, changing nothing, that :meth:`delete` would not be refused for a file that
        is not the topic's: every subscription's (loaded or not) v4 pending-ack log's.

        Raises:
            LedgerMismatch: naming the first foreign file found.
            MetadataStoreError: a pending-ack log's metadata could not be read.
        """
        for log_ in self._pending_ack_logs():
            await check_deletable(log_, self._store, self._storage)

    async def delete(self) -> None:
        """(The topic's deletion, its leaving set.) Close the loaded subscriptions and
        delete every subscription's v4 pending-ack log (loaded or not:
        :meth:`_pending_ack_logs`); the cursors go with the topic's ledger.

        Under the lock, after a consumer's load of one in flight (which lets go of it, the
        topic leaving): it opened the log as it was deleted, and wrote it afresh, left to be
        replayed by the name's subscription on a new topic.

        Raises:
            MetadataStoreError, LedgerError: a step failed (the caller closes the rest).
        """
        async with self._lock:  # after a load in flight, which then lets go of it
            logs = self._pending_ack_logs()  # (loaded subscriptions' or not)
            for subscription in list(self.loaded.values()):
                await subscription.close()
            for log_ in logs:
                await delete_log(log_, self._store, self._storage)
            self.loaded.clear()

    async def close(self) -> Exception | None:
        """(The topic's close, its leaving set.) Close every loaded subscription, each even
        if another fails (logged); return the first failure (None: all closed cleanly).

        After a consumer's load of one in flight, under the lock: the load lets go of what it
        made (the topic leaving) before the topic's close goes on. Left behind, it opened the
        subscription's v4 pending-ack log after the topic was closed, beside the instance
        loaded again for the next client, which held the log: one of the two was refused
        ("... is held by another writer"), the consumer with an internal error instead of a
        retry. Cancelled as it waits (a broker's stop out of time), it closes the loaded
        subscriptions all the same, and the load lets go of its own as it ends; a cancel
        that cuts one's close is raised once the others are closed (:meth:`_close_each`).
        """
        try:
            await self._lock.acquire()
        except asyncio.CancelledError:
            await self._close_loaded()
            raise
        try:
            return await self._close_loaded()
        finally:
            self._lock.release()

    async def _close_loaded(self) -> Exception | None:
        """:meth:`close`'s body: every loaded subscription closed; the first failure."""
        return await self._close_each(list(self.loaded.values()))

    async def _close_each(self, subscriptions: list[Subscription]) -> Exception | None:
        """Close ``subscriptions``, each even if one before failed; the first failure.

        A close cut by a cancel (its clean-close write past the cancel's grace, the store
        silent: :func:`~segtxn.aio.run_to_end`) raises the cancel once the rest are closed,
        in its handler, so that their writes share what is left of that grace. Only
        ``Exception`` was caught: the rest were skipped, and their v4 pending-ack logs held
        their files ("... is held by another writer" on the next load) until the broker
        restarted."""
        failure: Exception | None = None
        for i, subscription in enumerate(subscriptions):
            try:
                await subscription.close()
            except asyncio.CancelledError:
                await self._close_each(subscriptions[i + 1 :])
                raise
            except Exception as e:
                log.warning("%s: closing a part failed: %s: %s", self.name, type(e).__name__, e)
                failure = failure or e
        return failure
