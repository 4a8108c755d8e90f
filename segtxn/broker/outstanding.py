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

from sortedcontainers import SortedDict, SortedSet

from segtxn.broker.delivery import ConsumerLink
from segtxn.ledger import Position
from segtxn.protocol.errors import ErrorName, ServerError


class Outstanding:
    """The delivered but unacknowledged messages of one subscription (see the module
    docstring)."""

    def __init__(self) -> None:
        self.pending: dict[Position, ConsumerLink] = {}
        """Who each pending message was delivered to."""
        self.redeliver: SortedSet[Position] = SortedSet()
        """Shared: positions handed back, delivered before new ones."""
        self.deliveries: SortedDict[Position, int] = SortedDict()
        """How often each unacknowledged position was delivered (redelivery_count)."""

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

    def held(self, ids: list[Position], *, cumulative: bool) -> None:
        """A transaction holds the acks of ``ids`` now (with ``cumulative``, of everything
        up to the last of them): none of it is pending any more."""
        upto = max(ids)
        for position in [p for p in self.pending if (p <= upto if cumulative else p in ids)]:
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
        """(A rewind) Nothing is pending any more: it all comes again in position order.
        Returns how many messages were pending."""
        again = len(self.pending)
        for position, owner in self.pending.items():
            owner.pending.discard(position)
        self.pending.clear()
        return again

    def prune_deliveries(self, mark: Position) -> None:
        """Drop the delivery counts at or before the cursor's mark-delete position ``mark``
        (acknowledged: they never come again)."""
        while self.deliveries and self.deliveries.peekitem(0)[0] <= mark:
            self.deliveries.popitem(0)

    def check_txn_ack(
        self,
        link: ConsumerLink,
        ids: list[Position],
        *,
        cumulative: bool,
        ordered: bool,
        epoch: int | None,
        current_epoch: int,
    ) -> None:
        """Refuse a transactional ack of ``ids`` by ``link`` (delivered in ``epoch``) that
        would be held out of turn or out of order (the subscription is not Shared).

        On an ordered subscription a transaction may hold only what is pending on its
        consumer in the current epoch, in order: a message given to another consumer (this
        one lost its turn), delivered before a rewind, or after one the consumer received
        and left unacknowledged (its application dropped it, say, when an earlier
        transaction failed half-way through a batch) would be held out of order.

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
            skipped = [
                p
                for p in link.pending.irange(maximum=max(ids), inclusive=(True, False))
                if p not in ids
            ]
            if skipped:
                raise ServerError(
                    ErrorName.TRANSACTION_CONFLICT,
                    f"{max(ids)} comes after {skipped[0]}, which this consumer received and "
                    "has not acknowledged: on an ordered subscription a transaction "
                    "acknowledges in order (abort it; everything comes again in order)",
                )
