"""Retention: which ledgers of a managed ledger may be deleted, and when.

A managed ledger is a chain of ledgers (files), oldest first. Retention deletes whole
ledgers from the front of that chain; this module decides which, as a pure function of the
chain, the cursors' mark-delete positions, a :class:`RetentionPolicy` and the time, so the
rules can be read (and tested) in one place. :meth:`ManagedLedger.trim` applies the choice.

The contract:

- **Only closed ledgers, only from the front.** The ledger being appended to is never
  deleted, nor the last ledger of a sealed managed ledger (reads end there). Deletion stops
  at the first ledger that must be kept, so what remains is always a suffix of the chain:
  readers never find a hole.
- **Unconsumed data is never deleted.** A ledger is *consumed* once every cursor (durable
  subscription) has its mark-delete position at or past the ledger's last entry, both in
  memory and as the store holds it (a restart restores the saved one: an acknowledgment not
  saved yet is lost in a crash, and its entries must still be there to be delivered
  again). Cursor-less readers (readers, checkpoint consumers, the Spark source) hold
  nothing back: they read whatever retention keeps.
- **No cursors at all.** Then nothing acknowledges the data, so acknowledgment cannot be what
  releases it: a ledger counts as consumed once it has been closed for
  ``retention_time_s``, and only with a positive time limit. With a time limit of 0 or -1 a
  managed ledger without cursors keeps everything (the size axis, which counts consumed data
  only, does not apply to it either).
- **Consumed data is kept by time OR size** (Kafka's and Pulsar's rule): a consumed ledger
  is deleted once it has been closed for at least ``retention_time_s``, *or* once the
  consumed ledgers newer than it hold at least ``retention_bytes``. So ``retention_bytes`` is
  the amount of newest consumed data kept (give or take one ledger, like Kafka's
  ``retention.bytes``). -1 means no limit on that axis; both -1 keep consumed data forever;
  ``retention_time_s`` 0 deletes a ledger as soon as it is consumed (with cursors).
- **Age counts from the close**, which is the ledger's last write: its rollover, its seal, a
  clean close, or, after a crash, its recovery (later than the real last write, so a crash
  lengthens retention, never shortens it). The recovery rollover on reopen therefore never
  makes data deletable by itself: the recovered ledger's clock starts when it is recovered.
- **Empty ledgers** (a reopen that wrote nothing leaves one) hold nothing and are deleted
  whenever the front of the chain reaches them.

A crash half-way through a trim leaves either nothing changed or the ledgers gone from the
metadata (one compare-and-set) with some of their files still on disk: never a ledger the
metadata names without its file.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from segtxn.ledger.metadata import LedgerInfo
from segtxn.ledger.position import Position

NO_LIMIT = -1
"""A retention axis with this value never deletes anything."""
DEFAULT_RETENTION_TIME_S = 7 * 24 * 3600.0
"""A week, as Kafka's ``retention.ms`` default (604800000)."""


def check_limit(name: str, value: float) -> None:
    """Raise ``ValueError`` unless ``value`` is -1 (no limit) or a finite number >= 0."""
    if value != NO_LIMIT and not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be -1 (no limit) or a number >= 0, not {value!r}")


@dataclass(frozen=True)
class RetentionPolicy:
    """How long consumed data is kept (see the module docstring for the rules)."""

    retention_time_s: float = DEFAULT_RETENTION_TIME_S
    """Delete a consumed ledger once it has been closed this long (-1: no time limit;
    0: as soon as it is consumed). Without cursors, keep a ledger this long after it
    closed (0 or -1: forever)."""
    retention_bytes: int = NO_LIMIT
    """Delete a consumed ledger once the consumed ledgers newer than it hold at least this
    many bytes (-1: no size limit; 0: any consumed ledger)."""

    def __post_init__(self) -> None:
        check_limit("retention_time_s", self.retention_time_s)
        check_limit("retention_bytes", self.retention_bytes)
        if isinstance(self.retention_bytes, float):
            raise ValueError(f"retention_bytes must be an integer, not {self.retention_bytes}")


@dataclass(frozen=True)
class TrimResult:
    """What :meth:`ManagedLedger.trim` removed, so higher layers can trim their indexes."""

    ledgers: list[int]
    entries: int
    first_retained: Position | None
    """Everything before this position is gone (None: nothing was trimmed)."""


class ClosedLedger(NamedTuple):
    """What retention needs to know about one closed ledger."""

    id: int
    entries: int
    closed_ms: int
    """When it was closed (its last write, or its recovery after a crash)."""
    size_bytes: int


def closed_ledgers(
    ledgers: Sequence[LedgerInfo], open_size: Callable[[int], int]
) -> list[ClosedLedger]:
    """The ledgers retention may consider, oldest first: every one but the last (being
    appended to or, once sealed, where reads end). ``open_size``: the size of a ledger held
    open, for records that predate ``size_bytes``."""
    out: list[ClosedLedger] = []
    for info, successor in itertools.pairwise(ledgers):
        if info.entries is None:
            break
        # records from before closed_ms and size_bytes were kept: the next ledger was
        # created when this one closed; an unknown size counts as 0 bytes of newer
        # data (the size axis then keeps older ledgers longer, never shorter)
        closed_ms = successor.created_ms if info.closed_ms is None else info.closed_ms
        size = open_size(info.id) if info.size_bytes is None else info.size_bytes
        out.append(ClosedLedger(info.id, info.entries, closed_ms, size))
    return out


def deletable(
    ledgers: Sequence[ClosedLedger],
    marks: Collection[Position],
    policy: RetentionPolicy,
    now_ms: float,
) -> list[ClosedLedger]:
    """The front of ``ledgers`` that ``policy`` lets go.

    Args:
        ledgers: the closed ledgers retention may consider, oldest first (never the one
            being appended to, nor a sealed managed ledger's last).
        marks: every cursor's mark-delete position, the lower of the one in memory and
            the one the store may hold (empty: the managed ledger has none).
        policy: the limits.
        now_ms: the time, in milliseconds since the epoch.

    Returns:
        The ledgers to delete: a prefix of ``ledgers``, possibly empty.
    """
    consumed = _consumed_prefix(ledgers, marks, policy, now_ms)
    newer = sum(ledger.size_bytes for ledger in consumed)  # consumed bytes after the current
    out: list[ClosedLedger] = []
    for ledger in consumed:
        newer -= ledger.size_bytes
        by_size = policy.retention_bytes != NO_LIMIT and newer >= policy.retention_bytes
        if not (ledger.entries == 0 or _expired(ledger, policy, now_ms) or by_size):
            break
        out.append(ledger)
    return out


def _consumed_prefix(
    ledgers: Sequence[ClosedLedger],
    marks: Collection[Position],
    policy: RetentionPolicy,
    now_ms: float,
) -> list[ClosedLedger]:
    """The front of ``ledgers`` that every cursor has consumed (no cursors: that has been
    closed for a positive ``retention_time_s``)."""
    through = min(marks, default=None)
    out: list[ClosedLedger] = []
    for ledger in ledgers:
        if ledger.entries == 0:
            consumed = True
        elif through is not None:
            consumed = Position(ledger.id, ledger.entries - 1) <= through
        else:
            consumed = policy.retention_time_s > 0 and _expired(ledger, policy, now_ms)
        if not consumed:
            break
        out.append(ledger)
    return out


def _expired(ledger: ClosedLedger, policy: RetentionPolicy, now_ms: float) -> bool:
    limit = policy.retention_time_s
    return limit != NO_LIMIT and now_ms - ledger.closed_ms >= limit * 1000
