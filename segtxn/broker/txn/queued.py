"""A transaction's entries in a ledger's write queue: where each was placed (its position
chosen, as its write begins) and where it is once durable. The transaction buffer writes an
entry's op record from the first and answers its send from both (segtxn/broker/txn/buffer.py).
"""

from __future__ import annotations

import asyncio
from typing import NamedTuple

from segtxn.ledger import LedgerError, Position


class QueuedEntry(NamedTuple):
    """An entry in the ledger's write queue."""

    placed: asyncio.Future[Position]
    """Its position, once its write begins (the record can be written from then on)."""
    written: asyncio.Future[Position]
    """Its position once durable (another one if the write moved to the next ledger)."""


def settled(outcome: QueuedEntry | BaseException) -> Position | BaseException:
    """A queued write's position, or what it failed with."""
    if not isinstance(outcome, QueuedEntry):
        return outcome
    written = outcome.written
    if written.cancelled():
        return LedgerError("the write was cancelled")
    return written.exception() or written.result()


def chosen_position(queued: QueuedEntry) -> Position | None:
    """Where the entry was placed (None: not yet, or its write failed first)."""
    placed = queued.placed
    if not placed.done() or placed.cancelled() or placed.exception() is not None:
        return None
    return placed.result()


async def all_placed(queued: list[QueuedEntry]) -> None:
    """Return once each entry has its position chosen, or its write has ended."""
    for entry in queued:
        if not (entry.placed.done() or entry.written.done()):
            await asyncio.wait((entry.placed, entry.written), return_when=asyncio.FIRST_COMPLETED)
