"""Subscriptions: moving stored messages to consumers by permits, in order, without polling.

A :class:`Subscription` owns a durable cursor and the consumers attached to it. Its
dispatcher task sleeps on one event, woken by new entries (a :class:`Follower` parked on
the ledger), flow permits, acks, transaction outcomes and consumer changes; it never polls.

Exclusive and Failover subscriptions deliver to one active consumer
(:mod:`segtxn.broker.members` says which; Failover members are told with ``ActiveChange``);
Shared ones go round-robin to consumers with permits, with no ordering promise.

Delivered but unacknowledged messages are *pending*. Acks are durable (the cursor persists
them) before the ack receipt is sent. Handing messages back (an aborted transaction's acks,
a negative ack, a ``Redeliver``, a hand-over) is :mod:`segtxn.broker.redelivery`'s: an
Exclusive or Failover subscription rewinds to its earliest unacknowledged position and
delivers in order from there; a Shared one makes the messages due again one by one.

If the ledger cannot be read on (a damaged or missing ledger file), delivery stops there:
every consumer, and each that attaches later, gets an ``Error`` frame
(``PersistenceError``, naming the file), and it is logged once at ERROR. Acks still work.

An ack that meets its subscription closed (its topic unloaded while the ack was in
flight) is refused as ``ServiceNotReady``: retriable, since it may not be durable and
acknowledging again is harmless (the consumer does once it reaches the topic's owner).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

from segtxn.broker.delivery import ConsumerLink, Follower, readable, to_message, visible
from segtxn.broker.members import Members, SubscriptionType
from segtxn.broker.outstanding import Outstanding
from segtxn.broker.redelivery import Redelivery
from segtxn.broker.txn.pending_ack import NoPendingAcks, PendingAckStore
from segtxn.broker.txn.visibility import TransactionBuffer
from segtxn.ledger import (
    Entry,
    LedgerClosed,
    LedgerError,
    ManagedCursor,
    ManagedLedger,
    Position,
)
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.frames import ConsumerReady, EndOfTopic, Error
from segtxn.protocol.names import TopicName
from segtxn.protocol.txn import TxnId

READ_RETRY_S = 0.1
READ_RETRY_MAX_S = 5.0
"""How soon a read the ledger refused for now (too few replicas answered) is tried again:
doubling from the first to the most, back to the first once a read works."""
log = logging.getLogger(__name__)


class Subscription:
    def __init__(
        self,
        name: str,
        ledger: ManagedLedger,
        cursor: ManagedCursor,
        buffer: TransactionBuffer,
        *,
        batch: int,
        max_permits: int,
        hold_s: float = 0.0,
        rewinds: bool = True,
    ) -> None:
        """``rewinds=False`` is for tests of the soak harness only: ordered subscriptions
        then hand messages back one by one like Shared ones (out of order: the race the
        harness must catch)."""
        self.name = name
        self.ledger = ledger
        self.cursor = cursor
        self.buffer = buffer
        self._where = f"{ledger.name}/{name}"
        self.members = Members(
            name, TopicName.parse(ledger.name).segment or 0, hold_s, self._place_released
        )
        self.pending_acks: PendingAckStore = NoPendingAcks(ledger.name)
        self._batch = batch
        self._max_permits = max_permits
        self._outstanding = Outstanding()
        """Delivered, not yet acknowledged: to whom, what is due again, delivery counts."""
        self._round_robin = 0
        self._wake = asyncio.Event()
        self._redelivery = Redelivery(
            self._where,
            self.members,
            cursor,
            self._outstanding,
            holding=self._holding_acks,
            wake=self._wake,
            rewinds=rewinds,
        )
        """Handing messages back: the epoch, where delivery resumes, the fence, requests."""
        self.failed: Error | None = None
        """Why delivery stopped (the ledger cannot be read on), sent to every consumer."""
        buffer.on_change(self._wake.set)  # the read horizon moved: no polling
        self._follower = Follower(ledger, self._wake, self._where)
        self._task = asyncio.create_task(self._run(), name=f"dispatch-{self._where}")
        self.messages_out = 0
        self.bytes_out = 0
        """Messages and payload bytes delivered since it was loaded (for metrics)."""

    @property
    def type(self) -> SubscriptionType | None:
        return self.members.type

    @property
    def consumers(self) -> list[ConsumerLink]:
        return self.members.consumers

    # ------------------------------------------------------------------ consumers

    def attach(self, link: ConsumerLink, sub_type: SubscriptionType) -> bool:
        """Add a consumer and send it ``ConsumerReady`` (its first frame); returns whether
        it is active (False: a Failover standby).

        Raises:
            ServerError(ConsumerBusy): the subscription is Exclusive and taken, or has
                consumers of another type.
        """
        before = self.members.active()
        self.members.add(link, sub_type)
        self._redelivery.hand_over(before, joined=link)
        active = self.members.is_active(link)
        link.send(
            ConsumerReady(
                consumer_name=link.name,
                subscription=self.name,
                active=active,
                epoch=self._redelivery.epoch,
            )
        )
        if self.failed is not None:
            link.send(self.failed)
        log.info(
            "%s: consumer %s attached (%s, %s)",
            self._where,
            link.name,
            sub_type,
            "active" if active else "standby",
        )
        self._wake.set()
        return active

    def detach(self, link: ConsumerLink, *, dropped: bool = False) -> None:
        """Remove a consumer. A Failover member that ``dropped`` (its connection failed
        rather than closed) keeps its place for a while (see :class:`Members`): a segment it
        was active on is dispatched to nobody until it comes back or the place is released."""
        if link not in self.consumers:
            return
        before = self.members.active()
        held = self.members.remove(link, dropped=dropped)
        self._redelivery.forget(link)
        log.info(
            "%s: consumer %s detached (%s)%s",
            self._where,
            link.name,
            "dropped" if dropped else "closed",
            f"; its place is held {self.members.hold_s:g} s" if held else "",
        )
        if not self._redelivery.ordered:
            self._outstanding.hand_back(link)
        self._redelivery.hand_over(before)
        self._wake.set()

    def _place_released(self, before: ConsumerLink | None) -> None:
        log.info("%s: a dropped member did not come back; its place is released", self._where)
        self._redelivery.hand_over(before)
        self._wake.set()

    def flow(self, link: ConsumerLink, permits: int) -> None:
        if permits <= 0:
            raise ServerError(
                ErrorName.INVALID_ARGUMENT, f"permits must be positive, not {permits}"
            )
        link.permits = min(link.permits + permits, self._max_permits)
        self._wake.set()

    # ------------------------------------------------------------------ acks

    async def ack(self, link: ConsumerLink, ids: list[Position], *, cumulative: bool) -> None:
        """Acknowledge; returns once durable.

        Raises:
            ServerError(InvalidArgument): an id the topic never held.
            ServerError(NotAllowed): a cumulative ack on a Shared subscription.
            ServerError(ServiceNotReady): the subscription closed under it (its topic was
                unloaded); the ack may not be durable: acknowledge again.
            LedgerError: the cursor's save failed (:meth:`ManagedCursor.flush`); its socket
                answers it by the rule every call's failure is answered by
                (:func:`segtxn.failures.known`): a retriable one (``OwnerChanged``: its
                save met another owner's open of the ledger, which unloaded the topic) is
                ``ServiceNotReady``, a damaged record ``PersistenceError``.
        """
        self._check_known(ids)
        ids = [p for p in ids if not self.pending_acks.is_pending(p)]  # held by a transaction
        if not ids:
            return
        if cumulative:
            if self.type is SubscriptionType.SHARED:
                raise ServerError(ErrorName.NOT_ALLOWED, "Shared subscriptions ack individually")
            upto = max(ids)
            if self.pending_acks.holds_up_to(upto):
                return  # it would take a message a transaction holds: ignored, as a plain
                # ack of that message is (the transaction's abort redelivers it)
            self._outstanding.acked_up_to(upto)
            with self._unloaded_is_retriable():
                await self.cursor.ack_cumulative(upto)
        else:
            self._outstanding.acked(ids)
            with self._unloaded_is_retriable():
                await self.cursor.ack(ids)
        if cumulative:
            self._outstanding.prune_deliveries(self.cursor.mark_delete)
        if self.ledger.is_sealed:
            self._wake.set()  # the last ack of a sealed ledger ends it for the consumers

    async def txn_ack(
        self,
        link: ConsumerLink,
        txn: TxnId,
        ids: list[Position],
        *,
        cumulative: bool,
        epoch: int | None = None,
    ) -> None:
        """Acknowledge in a transaction: the messages stay with it until it ends.
        ``epoch`` is the delivery epoch the client received them in.

        Raises:
            ServerError: InvalidArgument, NotAllowed (cumulative on Shared, or a topic
                without v5 transactions), TransactionNotFound, TransactionConflict (among
                others: delivered before the latest rewind; they come again),
                ServiceNotReady (as :meth:`ack`).
        """
        self._check_known(ids)
        if cumulative and self.type is SubscriptionType.SHARED:
            raise ServerError(ErrorName.NOT_ALLOWED, "Shared subscriptions ack individually")
        if self.pending_acks.holds(txn, ids, cumulative=cumulative):
            return  # the same ack again in the same transaction (a retry): held already
        for position in ids:
            holder = self.pending_acks.holder(position)
            if holder is not None and holder != txn:
                raise ServerError(
                    ErrorName.TRANSACTION_CONFLICT,
                    f"{position} is acknowledged by transaction {holder}, still open",
                )

        def still_theirs() -> None:
            """(Checked again right before the acks are reserved: the transaction's header
            may be read from the store first, and a rewind may happen meanwhile.)"""
            if self.type is SubscriptionType.SHARED:
                return
            self._outstanding.check_txn_ack(
                link,
                txn,
                ids,
                cumulative=cumulative,
                ordered=self._redelivery.ordered,
                epoch=epoch,
                current_epoch=self._redelivery.epoch,
            )

        still_theirs()
        self._outstanding.acking_started(txn, ids)
        try:
            with self._unloaded_is_retriable():
                await self.pending_acks.ack(txn, ids, cumulative=cumulative, guard=still_theirs)
        finally:
            self._outstanding.acking_ended(txn, ids)
        self._outstanding.held(ids, cumulative=cumulative)
        self._wake.set()

    def _holding_acks(self) -> set[TxnId]:
        """The open transactions holding acks here, asked of the pending-ack store of the
        moment: the topic gives the subscription its store after creating it (the store
        needs :meth:`release`), so the store's own method cannot be bound at creation."""
        return self.pending_acks.transactions()

    @contextlib.contextmanager
    def _unloaded_is_retriable(self) -> Iterator[None]:
        """Refuse as ``ServiceNotReady`` (from it) the ``LedgerClosed`` of a cursor or a
        pending-ack log closed under an ack: the topic was unloaded, it is served again on
        the next use (here or by another broker), and an ack is harmless to repeat. Left
        as it was, it reached the client as ``UnknownError`` (fatal), logged as a bug: it
        is not retriable, since a closed ledger is a bug anywhere else. (A retriable
        ledger error, such as a save fenced by another owner, needs nothing here: every
        edge answers it ``ServiceNotReady``, :func:`segtxn.failures.known`.)"""
        try:
            yield
        except LedgerClosed as e:
            raise ServerError(
                ErrorName.SERVICE_NOT_READY,
                f"{self._where} was unloaded while acknowledging; acknowledge again ({e})",
            ) from e

    def release(self, positions: list[Position]) -> None:
        """A transaction's acks here were settled: committed (``positions`` empty) or
        aborted, letting ``positions`` go (for a cumulative ack, its last position: the
        rewind brings back everything unacknowledged before it too)."""
        self._redelivery.release(positions)

    def nack(self, link: ConsumerLink, ids: list[Position], request_id: int = 0) -> None:
        """Deliver these again. On an ordered subscription this rewinds (when ``link`` is
        the active consumer). ``request_id`` asks for a Rewind answer."""
        self._check_known(ids)
        self._redelivery.nack(link, ids, request_id)

    def redeliver(self, link: ConsumerLink, request_id: int, txn: TxnId | None) -> None:
        """Deliver ``link``'s unacknowledged messages again once ``txn`` (if any) holds no
        acks here, and answer with Rewind(request_id)."""
        self._redelivery.redeliver(link, request_id, txn)

    def _check_known(self, ids: list[Position]) -> None:
        if not ids:
            raise ServerError(ErrorName.INVALID_ARGUMENT, "no message ids given")
        for position in ids:
            if not self.ledger.contains(position):
                raise ServerError(
                    ErrorName.INVALID_ARGUMENT,
                    f"message id {position} is not a message of {self.ledger.name}",
                )

    # ------------------------------------------------------------------ dispatch

    async def _run(self) -> None:
        pause = READ_RETRY_S
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self.failed is not None:
                continue  # acks and consumer changes still wake it: nothing to deliver
            try:
                await self._dispatch()
                pause = READ_RETRY_S
            except (LedgerClosed, asyncio.CancelledError):
                raise
            except LedgerError as e:
                if not e.retriable:
                    self._fail(e)
                    continue
                # too few replicas answered, for now: delivery goes on once they do (it
                # stopped for good, until the topic was loaded again)
                log.warning("%s: reading at %s failed (%s); again in %g s",
                            self._where, self._redelivery.next, e, pause)  # fmt: skip
                asyncio.get_running_loop().call_later(pause, self._wake.set)
                pause = min(pause * 2, READ_RETRY_MAX_S)
            except Exception:
                log.exception("dispatcher of %s failed a round", self._where)

    def _fail(self, error: LedgerError) -> None:
        log.error("%s: delivery stopped at %s: %s", self._where, self._redelivery.next, error)
        self.failed = Error(
            error=ErrorName.PERSISTENCE,
            message=f"{self._where}: delivery stopped at {self._redelivery.next}: {error}",
        )
        for link in self.consumers:
            link.send(self.failed)

    def _ready(self) -> list[ConsumerLink]:
        if not self.consumers:
            return []
        if self.type is SubscriptionType.SHARED:
            return [c for c in self.consumers if c.permits > 0]
        if self._redelivery.fenced():  # woken when a transaction ends (its acks materialize)
            return []
        active = self.members.active()
        return [active] if active is not None and active.permits > 0 else []

    async def _dispatch(self) -> None:
        if self._redelivery.waiting:
            self._redelivery.answer_requests()
        while True:
            ready = self._ready()
            if not ready:
                return
            epoch = self._redelivery.epoch
            if self._outstanding.redeliver:
                position = self._outstanding.redeliver.pop(0)
                if self._settled(position) or position in self._outstanding.pending:
                    continue
                entries = await self.ledger.read(position, max_entries=1)
                if (
                    entries
                    and entries[0].position == position
                    and not (self._settled(position) or position in self._outstanding.pending)
                    and not self._deliver(entries[0])
                ):
                    self._outstanding.redeliver.add(position)  # nobody ready after the read: later
                continue
            budget = min(self._batch, sum(c.permits for c in ready))
            read = await self.ledger.read(self._redelivery.next, max_entries=budget)
            if self._redelivery.epoch != epoch:
                continue  # rewound while reading: older positions come first
            entries, cut = readable(read, self.buffer)
            if not entries:
                if not cut:
                    self._maybe_end()
                return  # woken again when the ledger or the read horizon moves
            invisible = []
            for entry in entries:
                if self._settled(entry.position) or entry.position in self._outstanding.pending:
                    self._redelivery.next = Position(
                        entry.position.ledger_id, entry.position.entry_id + 1
                    )
                    continue
                if not visible(self.buffer, entry):
                    invisible.append(entry.position)  # a marker, aborted, an orphan: never shown
                elif not self._deliver(entry):
                    break
                self._redelivery.next = Position(
                    entry.position.ledger_id, entry.position.entry_id + 1
                )
            if invisible:  # nobody will ever ack them: the cursor moves past them here
                await self.cursor.ack(invisible)

    def _settled(self, position: Position) -> bool:
        return self.cursor.is_acked(position) or self.pending_acks.is_pending(position)

    def _deliver(self, entry: Entry) -> bool:
        """Hand ``entry`` to a ready consumer; False if none is (it is left for later)."""
        ready = self._ready()
        if not ready:  # (permits ran out) read again from here next round
            return False
        if self.type is SubscriptionType.SHARED:
            self._round_robin = (self._round_robin + 1) % len(ready)
            link = ready[self._round_robin]
        else:
            link = ready[0]
        link.permits -= 1
        delivered = self._outstanding.delivered(link, entry.position)
        message = to_message(entry, delivered, self._redelivery.epoch)
        self.messages_out += 1
        self.bytes_out += len(message.payload)
        link.send(message)
        return True

    def _maybe_end(self) -> None:
        """On a sealed ledger, tell consumers once everything is delivered and acked."""
        if not self.ledger.is_sealed or self._outstanding.pending or self._outstanding.redeliver:
            return
        if not self.cursor.durable:
            return  # an ack still saving: its receipt goes out before the end (woken then)
        last = self.ledger.last_confirmed
        if last is not None and (
            self.buffer.max_read_position != last or self.cursor.mark_delete < last
        ):
            return
        for link in self.consumers:
            if not link.ended:
                link.ended = True
                link.send(EndOfTopic())

    def backlog(self) -> int:
        return self.cursor.backlog()

    @property
    def unacked(self) -> int:
        """Messages delivered to a consumer and not acknowledged yet."""
        return len(self._outstanding.pending)

    async def close(self) -> None:
        self.members.close()
        self.buffer.remove_listener(self._wake.set)
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self._follower.close()
        await self.pending_acks.close()
