"""Outstanding messages: what a subscription has delivered and not yet seen acknowledged.

A :class:`~segtxn.broker.dispatch.Subscription` decides what to deliver and when; this is
its bookkeeping of the messages out with consumers, kept apart so that every change to it
goes through a few small steps that keep its parts in step:

- which consumer each *pending* message (delivered, neither acknowledged nor held by a
  transaction) was given to, mirrored in that consumer's
  :attr:`~segtxn.broker.delivery.ConsumerLink.pending` set;
- on a Shared subscription, the positions handed back one by one: they are due again and
  come before new ones, to whichever consumer has permits;
- how often each unacknowledged position was delivered (a message's ``redelivery_count``).

It also holds the check a transactional ack must pass on an ordered subscription
(:meth:`Outstanding.check_txn_ack`): a transaction holds only what is pending on its own
consumer, delivered in the current epoch, in order.

Nothing here awaits or logs: the subscription changes and reads it in one step between its
awaits.
"""

from __future__ import annotations

from collections import OrderedDict

from sortedcontainers import SortedSet

from segtxn.broker.delivery import ConsumerLink
from segtxn.ledger import Position
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.txn import TxnId


class Outstanding:
    """The delivered but unacknowledged messages of one subscription (see the module
    docstring)."""

    def __init__(self) -> None:
        self.pending: dict[Position, ConsumerLink] = {}
        """Who each pending message was delivered to."""
        self.redeliver: SortedSet[Position] = SortedSet()
        """Shared: positions handed back, delivered before new ones."""
        self.deliveries: OrderedDict[Position, int] = OrderedDict()
        """How often each unacknowledged position was delivered (redelivery_count), in the
        order of their first deliveries: position order, mostly (a subscription delivers
        new positions in order; what comes again is here already), and pruned from the
        front (:meth:`prune_deliveries`). Not a sorted map: every delivery inserts here and
        every ack removes, and a ``SortedDict`` of positions cost 6 µs a message for the
        two. Not a plain dict: its iteration from the front walks every slot deleted there
        since its last resize, so each prune cost as much as all that was outstanding."""
        self.acking: dict[Position, TxnId] = {}
        """Pending positions whose transactional ack is on its way (checked, not yet held:
        the transaction's header or its op record is being read or written)."""

    def delivered(self, link: ConsumerLink, position: Position) -> int:
        """``position`` went to ``link``: it is pending there. Returns how often it was
        delivered before (its ``redelivery_count``)."""
        link.pending.add(position)
        self.pending[position] = link
        delivered = self.deliveries.get(position, 0)
        self.deliveries[position] = delivered + 1
        return delivered

    def acked(self, positions: list[Position]) -> None:
        """These were acknowledged individually: nothing about them is outstanding."""
        for position in positions:
            self.forget(position)
            self.redeliver.discard(position)
            self.deliveries.pop(position, None)

    def acked_up_to(self, upto: Position) -> None:
        """Everything up to ``upto`` was acknowledged cumulatively (delivery counts go with
        :meth:`prune_deliveries` once the cursor's mark-delete position has moved)."""
        for position in [p for p in self.pending if p <= upto]:
            self.forget(position)
        for position in [p for p in self.redeliver if p <= upto]:
            self.redeliver.discard(position)

    def forget(self, position: Position) -> None:
        """``position`` is pending nowhere any more."""
        owner = self.pending.pop(position, None)
        if owner is not None:
            owner.pending.discard(position)

    def acking_started(self, txn: TxnId, ids: list[Position]) -> None:
        """``txn``'s ack of ``ids`` passed its first check and is on its way."""
        for position in ids:
            self.acking[position] = txn

    def acking_ended(self, txn: TxnId, ids: list[Position]) -> None:
        """``txn``'s ack of ``ids`` is held, or failed."""
        for position in ids:
            if self.acking.get(position) == txn:
                del self.acking[position]

    def held(self, ids: list[Position], *, cumulative: bool) -> None:
        """A transaction holds the acks of ``ids`` now (with ``cumulative``, of everything
        up to the last of them): none of it is pending any more."""
        if not cumulative:
            for position in ids:
                self.forget(position)
            return
        upto = max(ids)
        for position in [p for p in self.pending if p <= upto]:
            self.forget(position)

    def due_again(self, position: Position) -> None:
        """(Shared) ``position`` is pending nowhere and comes again, before new messages, to
        whichever consumer has permits."""
        self.forget(position)
        self.redeliver.add(position)

    def hand_back(self, link: ConsumerLink) -> None:
        """(Shared) What ``link`` had not acknowledged is due again, for anyone."""
        for position in sorted(link.pending):
            self.due_again(position)

    def clear(self) -> int:
        """(A rewind) Nothing is pending any more: it all comes again in position order,
        also what was due again from Shared consumers before (served first, it came ahead
        of earlier positions). Returns how many messages were pending."""
        again = len(self.pending)
        for position, owner in self.pending.items():
            owner.pending.discard(position)
        self.pending.clear()
        self.redeliver.clear()
        return again

    def prune_deliveries(self, mark: Position) -> None:
        """Drop the delivery counts at or before the cursor's mark-delete position ``mark``
        (acknowledged: they never come again), from the first delivered on, up to the
        first one after ``mark``. A count left behind it goes once the mark passes that one
        too: one first delivered out of order (a message a transaction held before it was
        delivered, say, whose abort then delivers it after later ones); only its memory
        waits, never a count that is read (its position is acknowledged)."""
        deliveries = self.deliveries
        while deliveries and next(iter(deliveries)) <= mark:
            deliveries.popitem(last=False)

    def check_txn_ack(
        self,
        link: ConsumerLink,
        txn: TxnId,
        ids: list[Position],
        *,
        cumulative: bool,
        ordered: bool,
        epoch: int | None,
        current_epoch: int,
    ) -> None:
        """Refuse a transactional ack of ``ids`` in ``txn`` by ``link`` (delivered in
        ``epoch``) that would be held out of turn or out of order (the subscription is not
        Shared).

        On an ordered subscription a transaction may hold only what is pending on its
        consumer in the current epoch, in order: a message given to another consumer (this
        one lost its turn), delivered before a rewind, or after one the consumer received
        and left unacknowledged (its application dropped it, say, when an earlier
        transaction failed half-way through a batch) would be held out of order. An earlier
        message whose ack *in the same transaction* is on its way counts as acknowledged:
        a client may send a batch's acks without awaiting each (if that earlier ack fails,
        the transaction cannot commit, and its abort brings both back in order). One on its
        way in another transaction does not: that one may abort while this one commits.

        Raises:
            ServerError(TransactionConflict): saying which message and why.
        """
        if ordered and epoch is not None and epoch != current_epoch:
            raise ServerError(
                ErrorName.TRANSACTION_CONFLICT,
                f"{min(ids)} was delivered in epoch {epoch}; the subscription has rewound "
                f"since (epoch {current_epoch}) and is delivering it again",
            )
        strays = [p for p in ids if self.pending.get(p) is not link]
        if strays:
            raise ServerError(
                ErrorName.TRANSACTION_CONFLICT,
                f"{strays[0]} is not this consumer's to acknowledge now (the subscription "
                "moved it to another consumer or is delivering it again)",
            )
        if ordered and not cumulative:
            asked = set(ids)
            skipped = [
                p
                for p in link.pending.irange(maximum=max(ids), inclusive=(True, False))
                if p not in asked and self.acking.get(p) != txn
            ]
            if skipped:
                raise ServerError(
                    ErrorName.TRANSACTION_CONFLICT,
                    f"{max(ids)} comes after {skipped[0]}, which this consumer received and "
                    "has not acknowledged: on an ordered subscription a transaction "
                    "acknowledges in order (abort it; everything comes again in order)",
                )
