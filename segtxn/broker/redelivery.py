"""Redelivery: handing delivered, unacknowledged messages back without breaking their order.

A :class:`~segtxn.broker.dispatch.Subscription` moves messages to its consumers; this is
what it does when some must come again, and the state that says where its delivery
resumes: the delivery epoch, the next position to read, the fence after a hand-over, and
the clients' ``Redeliver`` requests that wait for a transaction to end. It is kept apart so
that every way of handing messages back goes through the same few steps. The subscription
owns one :class:`Redelivery` and calls it; its dispatcher reads :attr:`Redelivery.epoch`
and :attr:`Redelivery.next` (moving ``next`` on as it reads) and asks
:meth:`Redelivery.fenced` before it delivers to the active consumer.

**Ordered redelivery (Exclusive, Failover).** Whenever messages are handed back — a
transaction that acknowledged them aborts or times out, a negative ack, the active consumer
leaving, a Failover hand-over, a reconnect, a client's ``Redeliver`` — the subscription
*rewinds*: its epoch goes up, nothing stays pending, and delivery resumes at the earliest
unacknowledged position (the cursor's mark-delete + 1) and goes forward in position order,
skipping what is acknowledged or held by an open transaction. Everything that had been
delivered after that position is sent again (a Kafka consumer seeks back after an abort the
same way). The active consumer gets a ``Rewind`` frame before the first message of the new
epoch, and its client drops what it still had queued; so an application never receives an
older message of a topic after a newer one, except as a redelivery (``redelivery_count`` >
0). A read from the ledger that was in flight while a rewind happened is discarded.

A hand-over also *fences*: nothing goes to the new active consumer until every transaction
then holding acks on the subscription has ended (its acks may be aborted, and then their
messages must come first).

**Shared** subscriptions hand messages back one by one instead: they are due again and
come before new ones, to whichever consumer has permits.

Nothing here awaits: each step changes the subscription's state between its awaits and sets
the dispatcher's wake-up event.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from segtxn.broker.delivery import ConsumerLink
from segtxn.broker.members import Members, SubscriptionType
from segtxn.broker.outstanding import Outstanding
from segtxn.ledger import ManagedCursor, Position
from segtxn.protocol.frames import ActiveChange, Rewind
from segtxn.protocol.txn import TxnId

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Request:
    """A client's Redeliver (or Nack with a request id), answered with Rewind(request_id)
    once ``txn`` holds no acks here."""

    link: ConsumerLink
    request_id: int
    txn: TxnId | None


class Redelivery:
    """Handing messages back on one subscription (see the module docstring)."""

    def __init__(
        self,
        where: str,
        members: Members,
        cursor: ManagedCursor,
        outstanding: Outstanding,
        *,
        holding: Callable[[], set[TxnId]],
        wake: asyncio.Event,
        rewinds: bool,
    ) -> None:
        """``holding()`` returns the open transactions holding acks on the subscription;
        ``wake`` is its dispatcher's event."""
        self._where = where
        self.members = members
        self.cursor = cursor
        self._outstanding = outstanding
        self._holding = holding
        self._wake = wake
        self.rewinds = rewinds
        """False (for tests of the soak harness only): ordered subscriptions hand messages
        back one by one like Shared ones."""
        mark = cursor.mark_delete
        self.next = Position(mark.ledger_id, mark.entry_id + 1)
        """Where the dispatcher reads on from: it moves it forward, a rewind moves it back."""
        self.epoch = secrets.randbelow(1 << 30)
        """Goes up at every rewind; a read in flight across a change is discarded. It starts
        at random, so that an epoch from before a broker restart is not mistaken for one
        after it."""
        self._requests: list[_Request] = []
        """Requests not answered yet: their transaction still holds acks here."""
        self._fence: set[TxnId] = set()
        """Transactions that must end before the (new) active consumer gets more."""

    @property
    def ordered(self) -> bool:
        """Redelivery by rewinding (Exclusive and Failover)."""
        return self.rewinds and self.members.type is not SubscriptionType.SHARED

    @property
    def waiting(self) -> bool:
        """Some request waits for an answer."""
        return bool(self._requests)

    def fenced(self) -> bool:
        """Whether the active consumer must get nothing yet: a transaction that held acks
        at the last hand-over is still open (the dispatcher is woken when one ends)."""
        if self._fence:
            self._fence &= self._holding()
        return bool(self._fence)

    def forget(self, link: ConsumerLink) -> None:
        """``link`` detached: its requests go unanswered."""
        self._requests = [r for r in self._requests if r.link is not link]

    def hand_over(self, before: ConsumerLink | None, joined: ConsumerLink | None = None) -> None:
        """When the active consumer of an ordered subscription changes: fence, tell the
        Failover members whose role changed, and rewind (what the old active had not
        acknowledged goes to the new one, from the earliest unacknowledged position). A
        joiner learns its role from its ``ConsumerReady``; a new active consumer has
        nothing queued, so no ``Rewind`` frame is needed."""
        after = self.members.active()
        if self.members.type is SubscriptionType.SHARED or before is after:
            return
        self._fence = self._holding()
        if self.members.type is SubscriptionType.FAILOVER:
            if before is not None and before in self.members.consumers:
                before.send(ActiveChange(active=False))
            if after is not None and after is not joined and after in self.members.consumers:
                after.send(ActiveChange(active=True))
        log.info(
            "%s: hand-over from %s to %s%s",
            self._where,
            "nobody" if before is None else before.name,
            "nobody" if after is None else after.name,
            f", fenced until {len(self._fence)} open transaction(s) end" if self._fence else "",
        )
        if self.ordered:
            self._rewind("hand-over", notify=False)
        elif before is not None:
            self._outstanding.hand_back(before)

    def release(self, positions: list[Position]) -> None:
        """A transaction's acks here were settled: committed (``positions`` empty) or
        aborted, letting ``positions`` go (for a cumulative ack, its last position: the
        rewind brings back everything unacknowledged before it too)."""
        reason = None
        if positions:
            log.info(
                "%s: a transaction's acks of %d message(s) from %s were aborted",
                self._where,
                len(positions),
                min(positions),
            )
            if self.ordered:
                reason = "transaction aborted"
            else:
                for position in positions:
                    if not self.cursor.is_acked(position):
                        self._outstanding.due_again(position)
        self._outstanding.prune_deliveries(self.cursor.mark_delete)
        self.answer_requests(rewind=reason)
        self._wake.set()

    def nack(self, link: ConsumerLink, ids: list[Position], request_id: int = 0) -> None:
        """Deliver these (known) ids again. On an ordered subscription this rewinds (when
        ``link`` is the active consumer). ``request_id`` asks for a Rewind answer."""
        mine = [p for p in ids if self._outstanding.pending.get(p) is link]
        if self.ordered:
            if request_id:
                self._requests.append(_Request(link, request_id, None))
                self.answer_requests(rewind="negative ack" if mine else None)
            elif mine:
                self._rewind("negative ack", notify=True)
        else:
            for position in mine:
                self._outstanding.due_again(position)
            if request_id:
                self.redeliver(link, request_id, None)
        self._wake.set()

    def redeliver(self, link: ConsumerLink, request_id: int, txn: TxnId | None) -> None:
        """Deliver ``link``'s unacknowledged messages again once ``txn`` (if any) holds no
        acks here, and answer with Rewind(request_id)."""
        self._requests.append(_Request(link, request_id, txn))
        self.answer_requests()
        self._wake.set()

    def answer_requests(self, rewind: str | None = None) -> None:
        """Answer the requests whose transaction holds nothing here any more. On an ordered
        subscription an answer to the active consumer comes with a rewind (its client
        dropped its queue: what it held must come again); ``rewind`` forces one (naming
        why) even with nothing to answer. On a Shared one, the asking consumer's pending
        messages are due again."""
        holding = self._holding() if self._requests else set()
        ready = [r for r in self._requests if r.txn is None or r.txn not in holding]
        if ready:
            self._requests = [r for r in self._requests if r not in ready]
        if self.ordered:
            active = self.members.active()
            asked = any(r.link is active for r in ready)
            if rewind is not None or asked:
                self._rewind(rewind or "redeliver asked", notify=not asked)
        else:
            for request in ready:
                self._outstanding.hand_back(request.link)
        for request in ready:
            request.link.send(Rewind(epoch=self.epoch, request_id=request.request_id))

    def _rewind(self, reason: str, *, notify: bool) -> None:
        """Start delivery again at the earliest unacknowledged position (ordered
        subscriptions); ``notify`` sends the active consumer a Rewind frame."""
        self.epoch += 1
        again = self._outstanding.clear()
        mark = self.cursor.mark_delete
        self.next = Position(mark.ledger_id, mark.entry_id + 1)
        self._outstanding.prune_deliveries(mark)
        log.info(
            "%s: rewound to %s, epoch %d (%s; %d delivered unacknowledged will come again)",
            self._where,
            self.next,
            self.epoch,
            reason,
            again,
        )
        if notify:
            active = self.members.active()
            if active is not None and active in self.members.consumers:
                active.send(Rewind(epoch=self.epoch))
        self._wake.set()
