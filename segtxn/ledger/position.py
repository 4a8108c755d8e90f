"""Positions: where an entry lives in a managed ledger, totally ordered.

A managed ledger is a sequence of *ledgers* (files), each holding entries numbered from 0.
``Position(ledger_id, entry_id)`` orders first by ledger (ids only grow) and then by entry.
"""

from __future__ import annotations

from typing import NamedTuple


class Position(NamedTuple):
    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"

    def as_pair(self) -> tuple[int, int]:
        """A plain tuple, as records that store positions hold them."""
        return (self.ledger_id, self.entry_id)

    @classmethod
    def parse(cls, text: str) -> Position:
        """Inverse of ``str()``: ``"3:17"`` -> ``Position(3, 17)``."""
        ledger, _, entry = text.partition(":")
        try:
            return cls(int(ledger), int(entry))
        except ValueError:
            raise ValueError(f"not a position: {text!r} (expected LEDGER:ENTRY)") from None


class Entry(NamedTuple):
    position: Position
    payload: bytes
