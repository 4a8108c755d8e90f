"""Holding a managed ledger's writes: a test that needs appends queued but not yet durable
(or a write in progress) holds them at a gate it opens when it is ready."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from segtxn.ledger import ManagedLedger

HOLD_LIMIT_S = 10.0
"""A held write goes on by itself after this, so a failing test cannot hang its thread."""


def hold_writes(ledger: ManagedLedger) -> threading.Event:
    """Hold every write of the ledger's current log (in its writer thread) until the
    returned event is set."""
    current = ledger._current
    assert current is not None
    gate = threading.Event()
    original = current.append_batch

    def held(payloads: Sequence[bytes]) -> None:
        gate.wait(HOLD_LIMIT_S)
        original(payloads)

    current.append_batch = held  # type: ignore[method-assign]
    return gate
