"""Dispatch: moving stored messages to consumers and readers, by permits, without polling.

A :class:`Subscription` owns a durable cursor and the consumers attached to it. Its
dispatcher task sleeps on one event, woken by new entries (a task parked on the ledger's
``wait_for_entries``), flow permits, negative acks and consumer changes; it never polls.

- **Exclusive**: one consumer; a second is refused (``ConsumerBusy``).
- **Failover**: many consumers, one active (the longest connected); the others stand by and
  take over, in connection order, when it leaves. Each is told with ``ActiveChange``.
- **Shared**: messages go round-robin to consumers with permits; no ordering promise.

Delivered but unacknowledged messages are *pending*. A negative ack, or the consumer
leaving, makes them due for redelivery, which comes before new messages. Acks are durable
(the cursor persists them) before the ack receipt is sent.

A :class:`Reader` is a subscription without a cursor: it starts at a position and moves
forward as permits allow, acknowledging nothing.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
from collections.abc import Awaitable, Callable

from sortedcontainers import SortedSet

from segtxn.broker.entry import decode_entry
from segtxn.broker.txn.buffer import TransactionBuffer
from segtxn.broker.txn.pending_ack import NoPendingAcks, PendingAckStore
from segtxn.ledger import (
    Entry,
    LedgerClosed,
    LedgerError,
    LedgerSealed,
    ManagedCursor,
    ManagedLedger,
    Position,
)
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.frames import ActiveChange, EndOfTopic, Frame, Message
from segtxn.protocol.names import TopicName
from segtxn.protocol.txn import TxnId

log = logging.getLogger(__name__)


class SubscriptionType(enum.StrEnum):
    EXCLUSIVE = "Exclusive"
    FAILOVER = "Failover"
    SHARED = "Shared"


class ConsumerLink:
    """A connected consumer (or reader) as the dispatcher sees it: permits, pending
    messages, and a way to hand it frames (``send`` never blocks: the connection's
    outbound queue holds at least ``max_permits`` frames)."""

    _ids = itertools.count(1)

    def __init__(
        self,
        name: str,
        send: Callable[[Frame], None],
        disconnect: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self.id = next(self._ids)
        self.name = name
        self.send = send
        self.disconnect = disconnect
        """Hang up on the client (e.g. its topic was deleted); it then reconnects."""
        self.permits = 0
        self.pending: set[Position] = set()
        self.ended = False


def to_message(entry: Entry, redelivery_count: int = 0) -> Message:
    stored = decode_entry(entry.payload)
    return Message(
        message_id=(entry.position.ledger_id, entry.position.entry_id),
        payload=stored.payload,
        key=stored.key,
        properties=stored.properties,
        publish_time_ms=stored.publish_time_ms,
        event_time_ms=stored.event_time_ms,
        producer_name=stored.producer_name,
        sequence_id=stored.sequence_id,
        redelivery_count=redelivery_count,
    )


class _Follower:
    """Sets ``wake`` every time the ledger has entries beyond what was seen, or ends."""

    def __init__(self, ledger: ManagedLedger, wake: asyncio.Event, name: str) -> None:
        self._ledger = ledger
        self._wake = wake
        self.task = asyncio.create_task(self._run(), name=f"follow-{name}")

    async def _run(self) -> None:
        seen = self._ledger.last_confirmed
        while True:
            try:
                await self._ledger.wait_for_entries(seen)
            except (LedgerSealed, LedgerClosed, LedgerError):
                self._wake.set()
                return
            seen = self._ledger.last_confirmed
            self._wake.set()

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


def _readable(entries: list[Entry], buffer: TransactionBuffer) -> tuple[list[Entry], bool]:
    """The entries within the transaction buffer's horizon, and whether the horizon cut."""
    horizon = buffer.max_read_position
    if horizon is None:
        return [], bool(entries)
    within = [e for e in entries if e.position <= horizon]
    return within, len(within) < len(entries)


def _visible(buffer: TransactionBuffer, entry: Entry) -> bool:
    """Whether a consumer may see ``entry``: not a v4 marker, not of an aborted (or
    orphaned) transaction."""
    stored = decode_entry(entry.payload)
    if stored.marker is not None:
        return False
    return buffer.visible(None if stored.txn is None else TxnId(*stored.txn), entry.position)


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
    ) -> None:
        self.name = name
        self.ledger = ledger
        self._hold_s = hold_s
        self._held: dict[str, tuple[ConsumerLink, asyncio.TimerHandle]] = {}
        """Failover members that dropped off, keeping their place until they return."""
        self.cursor = cursor
        self.buffer = buffer
        self._index = TopicName.parse(ledger.name).segment or 0
        self.pending_acks: PendingAckStore = NoPendingAcks(ledger.name)
        self.type: SubscriptionType | None = None
        self.consumers: list[ConsumerLink] = []
        self._batch = batch
        self._max_permits = max_permits
        mark = cursor.mark_delete
        self._next = Position(mark.ledger_id, mark.entry_id + 1)
        self._pending: dict[Position, ConsumerLink] = {}
        self._redeliver: SortedSet[Position] = SortedSet()
        self._redeliveries: dict[Position, int] = {}
        self._round_robin = 0
        self._fence: set[TxnId] = set()
        """Transactions that must end before the (new) active consumer gets more."""
        self._wake = asyncio.Event()
        buffer.on_change(self._wake.set)  # the read horizon moved: no polling
        self._follower = _Follower(ledger, self._wake, f"{ledger.name}/{name}")
        self._task = asyncio.create_task(self._run(), name=f"dispatch-{ledger.name}/{name}")
        self.messages_out = 0

    # ------------------------------------------------------------------ consumers

    def attach(self, link: ConsumerLink, sub_type: SubscriptionType) -> bool:
        """Add a consumer; returns whether it is active (False: a Failover standby).

        Raises:
            ServerError(ConsumerBusy): the subscription is Exclusive and taken, or has
                consumers of another type.
        """
        if self.consumers and self.type is not sub_type:
            raise ServerError(
                ErrorName.CONSUMER_BUSY,
                f"subscription {self.name!r} has {self.type} consumers; cannot add {sub_type}",
            )
        if sub_type is SubscriptionType.EXCLUSIVE and self.consumers:
            raise ServerError(
                ErrorName.CONSUMER_BUSY, f"subscription {self.name!r} already has a consumer"
            )
        before = self._active()
        self.type = sub_type
        held = self._held.pop(link.name, None)
        if held is not None:  # back in time: its place (and its segments) are its own again
            held[1].cancel()
        self.consumers.append(link)
        self._hand_over(before, joined=link)
        self._wake.set()
        return self._is_active(link)

    def detach(self, link: ConsumerLink, *, dropped: bool = False) -> None:
        """Remove a consumer. A Failover member that ``dropped`` (its connection failed
        rather than closed) keeps its place for ``hold_s``: while it is away, a segment it
        was active on is dispatched to nobody; it resumes if it comes back under its name."""
        if link not in self.consumers:
            return
        before = self._active()
        self.consumers.remove(link)
        if (
            dropped
            and self._hold_s > 0
            and self.type is SubscriptionType.FAILOVER
            and link.name not in self._held
            and all(c.name != link.name for c in self.consumers)
        ):
            placeholder = ConsumerLink(link.name, lambda _frame: None)
            timer = asyncio.get_running_loop().call_later(
                self._hold_s, self._release_place, link.name
            )
            self._held[link.name] = (placeholder, timer)
        for position in list(link.pending):
            self._pending.pop(position, None)
            self._due_again(position)
        link.pending.clear()
        self._hand_over(before)
        self._wake.set()

    def _release_place(self, name: str) -> None:
        """A dropped member did not come back in time: its segments move on."""
        if name not in self._held:
            return
        before = self._active()
        del self._held[name]
        self._hand_over(before)
        self._wake.set()

    def _active(self) -> ConsumerLink | None:
        """The consumer that receives everything (Exclusive, Failover); None for Shared.

        Failover members (held places included) are ordered by name; segment ``i`` goes to
        member ``i mod n``, so the segments of a scalable topic are shared out among the
        members, each segment to one of them (as Pulsar does with partitions). A held place
        has no permits: nothing is dispatched to it.
        """
        if self.type is SubscriptionType.SHARED:
            return None
        if self.type is SubscriptionType.EXCLUSIVE:
            return self.consumers[0] if self.consumers else None
        members = self.consumers + [placeholder for placeholder, _ in self._held.values()]
        if not members:
            return None
        members.sort(key=lambda c: (c.name, c.id))
        return members[self._index % len(members)]

    def _hand_over(self, before: ConsumerLink | None, joined: ConsumerLink | None = None) -> None:
        """Tell Failover members whose role changed; the old active's unacknowledged
        messages go to the new one.

        An ordered subscription (Exclusive, Failover) whose active consumer changes is
        *fenced*: nothing is dispatched to the new one until every transaction then holding
        acks on it has ended. Those acks may be aborted (a killed processor's transaction
        times out), and their messages must then come first, before anything after them."""
        after = self._active()
        if self.type is not SubscriptionType.SHARED and before is not after:
            self._fence = self.pending_acks.transactions()
        if self.type is not SubscriptionType.FAILOVER or before is after:
            return
        if before is not None and before in self.consumers:
            for position in list(before.pending):
                self._pending.pop(position, None)
                self._due_again(position)
            before.pending.clear()
            before.send(ActiveChange(active=False))
        if after is not None and after is not joined:  # a joiner learns it from its ready frame
            after.send(ActiveChange(active=True))

    def _is_active(self, link: ConsumerLink) -> bool:
        return self.type is SubscriptionType.SHARED or self._active() is link

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
        """
        self._check_known(ids)
        ids = [p for p in ids if not self.pending_acks.is_pending(p)]  # held by a transaction
        if not ids:
            return
        if cumulative:
            if self.type is SubscriptionType.SHARED:
                raise ServerError(ErrorName.NOT_ALLOWED, "Shared subscriptions ack individually")
            upto = max(ids)
            for position in [p for p in self._pending if p <= upto]:
                self._forget(position)
            for position in [p for p in self._redeliver if p <= upto]:
                self._redeliver.discard(position)
            await self.cursor.ack_cumulative(upto)
        else:
            for position in ids:
                self._forget(position)
                self._redeliver.discard(position)
            await self.cursor.ack(ids)
        if self.ledger.is_sealed:
            self._wake.set()  # the last ack of a sealed ledger ends it for the consumers

    async def txn_ack(
        self, link: ConsumerLink, txn: TxnId, ids: list[Position], *, cumulative: bool
    ) -> None:
        """Acknowledge in a transaction: the messages stay with it until it ends.

        Raises:
            ServerError: InvalidArgument, NotAllowed (cumulative on Shared, or a topic
                without v5 transactions), TransactionNotFound, TransactionConflict.
        """
        self._check_known(ids)
        if cumulative and self.type is SubscriptionType.SHARED:
            raise ServerError(ErrorName.NOT_ALLOWED, "Shared subscriptions ack individually")
        if self.type is not SubscriptionType.SHARED:
            # In an ordered subscription a message given to another consumer (this one lost
            # its turn) must not be held by this one's transaction: the new owner would go
            # past it, and an abort would bring it back out of order.
            strays = [p for p in ids if self._pending.get(p) is not link]
            if strays:
                raise ServerError(
                    ErrorName.TRANSACTION_CONFLICT,
                    f"{strays[0]} is not this consumer's to acknowledge now "
                    "(the subscription moved it to another consumer, or it was not delivered)",
                )
        await self.pending_acks.ack(txn, ids, cumulative=cumulative)
        upto = max(ids)
        for position in [p for p in self._pending if (p <= upto if cumulative else p in ids)]:
            self._forget(position)
        self._wake.set()

    def release(self, positions: list[Position]) -> None:
        """An aborted transaction let these go: deliver them again."""
        for position in positions:
            if not self.cursor.is_acked(position):
                self._forget(position, keep_count=True)
                self._due_again(position)
        self._wake.set()

    def nack(self, link: ConsumerLink, ids: list[Position]) -> None:
        self._check_known(ids)
        for position in ids:
            if self._pending.get(position) is link:
                self._forget(position, keep_count=True)
                self._due_again(position)
        self._wake.set()

    def _check_known(self, ids: list[Position]) -> None:
        if not ids:
            raise ServerError(ErrorName.INVALID_ARGUMENT, "no message ids given")
        for position in ids:
            if not self.ledger.contains(position):
                raise ServerError(
                    ErrorName.INVALID_ARGUMENT,
                    f"message id {position} is not a message of {self.ledger.name}",
                )

    def _forget(self, position: Position, *, keep_count: bool = False) -> None:
        owner = self._pending.pop(position, None)
        if owner is not None:
            owner.pending.discard(position)
        if not keep_count:
            self._redeliveries.pop(position, None)

    def _due_again(self, position: Position) -> None:
        self._redeliver.add(position)
        self._redeliveries[position] = self._redeliveries.get(position, 0) + 1

    # ------------------------------------------------------------------ dispatch

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._dispatch()
            except (LedgerClosed, asyncio.CancelledError):
                raise
            except Exception:
                log.exception("dispatcher of %s/%s failed a round", self.ledger.name, self.name)

    def _ready(self) -> list[ConsumerLink]:
        if not self.consumers:
            return []
        if self.type is SubscriptionType.SHARED:
            return [c for c in self.consumers if c.permits > 0]
        if self._fence:  # woken when a transaction ends (its acks materialize)
            self._fence &= self.pending_acks.transactions()
            if self._fence:
                return []
        active = self._active()
        return [active] if active is not None and active.permits > 0 else []

    async def _dispatch(self) -> None:
        while True:
            ready = self._ready()
            if not ready:
                return
            if self._redeliver:
                position = self._redeliver.pop(0)
                if self._settled(position) or position in self._pending:
                    continue
                entries = await self.ledger.read(position, max_entries=1)
                if entries and entries[0].position == position:
                    self._deliver(entries[0])
                continue
            budget = min(self._batch, sum(c.permits for c in ready))
            entries, cut = _readable(
                await self.ledger.read(self._next, max_entries=budget), self.buffer
            )
            if not entries:
                if not cut:
                    self._maybe_end()
                return  # woken again when the ledger or the read horizon moves
            invisible = []
            for entry in entries:
                self._next = Position(entry.position.ledger_id, entry.position.entry_id + 1)
                if self._settled(entry.position) or entry.position in self._pending:
                    continue
                if not _visible(self.buffer, entry):
                    invisible.append(entry.position)  # a marker, aborted, an orphan: never shown
                    continue
                self._deliver(entry)
            if invisible:  # nobody will ever ack them: the cursor moves past them here
                await self.cursor.ack(invisible)

    def _settled(self, position: Position) -> bool:
        return self.cursor.is_acked(position) or self.pending_acks.is_pending(position)

    def _deliver(self, entry: Entry) -> None:
        ready = self._ready()
        if not ready:  # consumers left while reading
            self._redeliver.add(entry.position)
            return
        if self.type is SubscriptionType.SHARED:
            self._round_robin = (self._round_robin + 1) % len(ready)
            link = ready[self._round_robin]
        else:
            link = ready[0]
        link.permits -= 1
        link.pending.add(entry.position)
        self._pending[entry.position] = link
        self.messages_out += 1
        link.send(to_message(entry, self._redeliveries.get(entry.position, 0)))

    def _maybe_end(self) -> None:
        """On a sealed ledger, tell consumers once everything is delivered and acked."""
        if not self.ledger.is_sealed or self._pending or self._redeliver:
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

    async def close(self) -> None:
        for _, timer in self._held.values():
            timer.cancel()
        self._held.clear()
        self.buffer.remove_listener(self._wake.set)
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self._follower.close()
        await self.pending_acks.close()


class Reader:
    """A cursor-less, forward-only view of a topic from a start position (committed data
    only, like a consumer). It ends (``end_of_topic``) at the end of a sealed ledger, or once
    it has passed ``end`` (inclusive) when one is given."""

    def __init__(
        self,
        ledger: ManagedLedger,
        buffer: TransactionBuffer,
        link: ConsumerLink,
        start: Position,
        *,
        batch: int,
        max_permits: int,
        end: Position | None = None,
    ) -> None:
        self.ledger = ledger
        self.buffer = buffer
        self.link = link
        self._next = start
        self._end = end
        self._batch = batch
        self._max_permits = max_permits
        self._wake = asyncio.Event()
        buffer.on_change(self._wake.set)
        self._follower = _Follower(ledger, self._wake, f"{ledger.name}/reader-{link.id}")
        self._task = asyncio.create_task(self._run(), name=f"reader-{ledger.name}-{link.id}")

    def flow(self, permits: int) -> None:
        if permits <= 0:
            raise ServerError(
                ErrorName.INVALID_ARGUMENT, f"permits must be positive, not {permits}"
            )
        self.link.permits = min(self.link.permits + permits, self._max_permits)
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self.link.permits > 0 and not self.link.ended:
                if self._end is not None and self._next > self._end:
                    self.link.ended = True
                    self.link.send(EndOfTopic())
                    break
                entries, cut = _readable(
                    await self.ledger.read(
                        self._next, max_entries=min(self._batch, self.link.permits)
                    ),
                    self.buffer,
                )
                if not entries:
                    if not cut and self.ledger.is_sealed and not self.link.ended:
                        self.link.ended = True
                        self.link.send(EndOfTopic())
                    break
                for entry in entries:
                    self._next = Position(entry.position.ledger_id, entry.position.entry_id + 1)
                    if not _visible(self.buffer, entry):
                        continue
                    self.link.permits -= 1
                    self.link.send(to_message(entry))

    async def close(self) -> None:
        self.buffer.remove_listener(self._wake.set)
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self._follower.close()
