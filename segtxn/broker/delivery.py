"""What subscriptions and readers share to deliver stored messages: the link to a
connected client, the entry-to-frame conversion, and the wake-up on new entries.

Both deliver only what the transaction buffer allows: nothing past its read horizon
(``max_read_position``), and no entry of an aborted or orphaned transaction, nor a v4
marker. Neither ever polls: a :class:`Follower` parks on the ledger and sets an event when
entries arrive, and the buffer calls back when its horizon moves.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable

from sortedcontainers import SortedSet

from segtxn.broker.entry import decode_entry
from segtxn.broker.txn.visibility import TransactionBuffer
from segtxn.ledger import Entry, LedgerClosed, LedgerError, LedgerSealed, ManagedLedger, Position
from segtxn.protocol.frames import Frame, Message
from segtxn.protocol.txn import TxnId


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
        self.pending: SortedSet[Position] = SortedSet()
        """Delivered to this consumer, neither acknowledged nor held by a transaction."""
        self.ended = False


def to_message(entry: Entry, redelivery_count: int = 0, epoch: int = 0) -> Message:
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
        epoch=epoch,
    )


class Follower:
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


def readable(entries: list[Entry], buffer: TransactionBuffer) -> tuple[list[Entry], bool]:
    """The entries within the transaction buffer's horizon, and whether the horizon cut."""
    horizon = buffer.max_read_position
    if horizon is None:
        return [], bool(entries)
    within = [e for e in entries if e.position <= horizon]
    return within, len(within) < len(entries)


def visible(buffer: TransactionBuffer, entry: Entry) -> bool:
    """Whether a consumer may see ``entry``: not a v4 marker, not of an aborted (or
    orphaned) transaction."""
    stored = decode_entry(entry.payload)
    if stored.marker is not None:
        return False
    return buffer.visible(None if stored.txn is None else TxnId(*stored.txn), entry.position)
