"""Naming the operations of a transaction, so a client and a broker can agree on a set of
them without sending it: the one-step commit (docs/transactions.md).

A client that sent every operation of a v5 transaction to one broker asks that broker to
commit it, saying how many distinct operations it made and their :func:`digest`. The broker
commits only if the operations whose op records it queued for the transaction are exactly
those: the same count and the same digest. Both sides name an operation with the functions
here, from what both know: a send by its segment, producer name and sequence id (a resend
after a reconnect is the same send); an acknowledgment by its segment, subscription,
position and kind. A name that differs on the two sides costs the fast path, never
correctness: the digests differ, and the client ends the transaction at its coordinator.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

_MASK = (1 << 64) - 1


def send_op(segment: str, producer: str, seq: int) -> str:
    """The name of a transactional send of ``producer`` on ``segment``."""
    return f"s {segment} {producer} {seq}"


def ack_op(segment: str, subscription: str, position: tuple[int, int], cumulative: bool) -> str:
    """The name of a transactional acknowledgment of ``position`` on ``segment``."""
    return f"{'c' if cumulative else 'a'} {segment} {subscription} {position[0]}:{position[1]}"


def digest(ops: Iterable[str]) -> int:
    """An order-independent 64-bit digest of a set of operation names (each counted once
    by the caller): the sum of their :func:`op_hash`, modulo 2**64, so it can also be kept
    as names arrive (:func:`add`)."""
    total = 0
    for op in ops:
        total = add(total, op)
    return total


def op_hash(op: str) -> int:
    """BLAKE2b-64 of an operation name."""
    return int.from_bytes(hashlib.blake2b(op.encode(), digest_size=8).digest(), "big")


def add(total: int, op: str) -> int:
    """``total`` (a digest) with ``op`` counted in it."""
    return (total + op_hash(op)) & _MASK
