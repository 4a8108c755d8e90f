"""What a dispatcher may deliver, per topic or segment: the transaction buffer's interface.

The dispatcher asks two things (PIP-471: "the dispatcher does not change"):
``max_read_position`` — nothing after it may be delivered yet — and ``visible(entry)`` —
whether a transactional entry at or before it is committed. It waits on ``changed``
(notified, never polled) for the horizon to move.

:class:`NoTransactions` serves topics without transactions; the v5 buffer is
:class:`segtxn.broker.txn.buffer.MetadataTransactionBuffer`, the v4 one
:class:`segtxn.broker.txn.markers.MarkerTransactionBuffer`.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, MutableMapping, Sequence

from segtxn.broker.ordering import Turn
from segtxn.ledger import ManagedLedger, Position, TrimResult
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.txn import TxnId


class OpenTransactions(MutableMapping[TxnId, Position]):
    """The open transactions of a topic or segment -> their first entry there, noting when
    each was first seen open here (monotonic): how long the oldest one has held the
    horizon back is what an operator needs when "one stuck transaction blocks every
    reader". After a reload, a transaction counts as open since the load."""

    def __init__(self) -> None:
        self._first: dict[TxnId, Position] = {}
        self._since: dict[TxnId, float] = {}

    def __getitem__(self, txn: TxnId) -> Position:
        return self._first[txn]

    def __setitem__(self, txn: TxnId, position: Position) -> None:
        self._first[txn] = position
        self._since.setdefault(txn, time.monotonic())

    def __delitem__(self, txn: TxnId) -> None:
        del self._first[txn]
        del self._since[txn]

    def __iter__(self) -> Iterator[TxnId]:
        return iter(self._first)

    def __len__(self) -> int:
        return len(self._first)

    def __contains__(self, txn: object) -> bool:  # (Mapping's would raise and catch)
        return txn in self._first

    def get(self, txn: TxnId, default: Position | None = None) -> Position | None:  # type: ignore[override]
        return self._first.get(txn, default)

    def oldest_age_s(self) -> float | None:
        """Seconds since the longest-open transaction here was first seen (None: none is
        open). Seen-times only grow in insertion order, so the first one is the oldest."""
        for since in self._since.values():
            return time.monotonic() - since
        return None


class TransactionBuffer(ABC):
    """What a dispatcher asks about transactions on one topic or segment."""

    def __init__(self) -> None:
        self._listeners: list[Callable[[], None]] = []

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` whenever ``max_read_position`` or visibility may have changed."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def _changed(self) -> None:
        for listener in list(self._listeners):
            listener()

    @property
    @abstractmethod
    def max_read_position(self) -> Position | None:
        """Nothing after this may be delivered (None: nothing at all)."""

    @abstractmethod
    def visible(self, txn: TxnId | None, position: Position) -> bool:
        """Whether an entry at or before ``max_read_position`` may be delivered."""

    def oldest_open_age_s(self) -> float | None:
        """How long the oldest transaction open here has been (None: none is; for metrics)."""
        return None

    @abstractmethod
    async def append(self, txn: TxnId, payload: bytes, turn: Turn) -> Position:
        """Append a transactional entry (one ledger append) and record it.

        The entry is queued on the ledger with ``turn`` (:meth:`Turn.enqueue`): only after
        the producer's earlier sends have queued theirs, so the producer's order is kept.
        Checks that may wait (a header read, a property update) come before the turn, so
        they run concurrently with the earlier sends; the caller releases the turn if this
        fails before queueing.
        """

    async def append_together(
        self, txn: TxnId, entries: list[tuple[bytes, Turn]], *, ops: Sequence[str] = ()
    ) -> list[Position | BaseException]:
        """Append entries of ``txn`` that arrived together, each in its turn: each one's
        position or what :meth:`append` would have raised, in order. Every turn is released
        however this ends. By default an :meth:`append` each, concurrently. ``ops``: each
        entry's operation name (:func:`segtxn.protocol.txnops.send_op`), for a buffer that
        counts them for the one-step commit."""

        async def one(payload: bytes, turn: Turn) -> Position:
            try:
                return await self.append(txn, payload, turn)
            finally:
                turn.release()

        return await asyncio.gather(*(one(p, t) for p, t in entries), return_exceptions=True)

    async def recover(self) -> None:  # noqa: B027 - nothing to rebuild unless overridden
        """Rebuild state on load."""

    async def trimmed(self, result: TrimResult) -> None:  # noqa: B027
        """The ledger dropped data before ``result.first_retained``: drop its indexes."""

    async def deleted(self) -> None:  # noqa: B027
        """The topic's ledger was deleted (after :meth:`close`): drop what is kept about it
        elsewhere, so that nothing of it applies to a topic created again under its name."""

    async def close(self) -> None:  # noqa: B027
        """Stop background work."""


class NoTransactions(TransactionBuffer):
    """A topic without transactions (``persistent://`` until v4 transactions exist)."""

    def __init__(self, ledger: ManagedLedger) -> None:
        super().__init__()
        self._ledger = ledger

    @property
    def max_read_position(self) -> Position | None:
        return self._ledger.last_confirmed

    def visible(self, txn: TxnId | None, position: Position) -> bool:
        return True

    async def append(self, txn: TxnId, payload: bytes, turn: Turn) -> Position:
        raise ServerError(
            ErrorName.NOT_ALLOWED,
            f"{self._ledger.name}: v5 transactions run on scalable topics (segment://); "
            "persistent:// topics take part in v4 (marker-based) transactions",
        )
