"""Ranges of a segment's entries: how the ``segtxn`` data source cuts a big segment into
Spark input partitions, and how one partition is read.

A position is ``LEDGER:ENTRY``. A segment's ledgers are numbered 1, 2, 3 ... in the order it
wrote them (a new one at each roll-over, every ``max_ledger_bytes``, and each time a broker
loads the segment), and a ledger's entries 0, 1, 2 .... A reader from ``start`` to ``end``
(both inclusive) delivers exactly the committed entries between them, wherever the ledgers
begin and end (a position past a ledger's last entry, or in a ledger retention deleted, reads
on from the next entry there is). So any increasing cut points split a range into ranges
that cover each entry exactly once, whatever the real layout: :func:`split`.

What the broker tells a reader of the layout is only the last entry (its ledger and entry
id). Entries ``L:0 .. L:E`` of the last ledger are known to exist, and are cut every
``entries_per_range``; each earlier ledger is one range of its own (a ledger holds at most
``max_ledger_bytes``, 64 MiB by default), since how many entries it holds is unknown here.
A ledger that retention deleted is then a range that reads nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from segtxn.client import Client, TopicEnded, TopicNotFound

Position = tuple[int, int]
"""``(ledger_id, entry_id)``; tuples compare the way the broker orders positions."""
FIRST: Position = (1, 0)
"""A segment's first position (its first ledger is 1): a read from here starts at the first
entry the segment still holds."""
LAST_ENTRY = 2**63 - 1
"""The largest entry id a position may name: ``L:LAST_ENTRY`` is the end of ledger ``L``."""

SCHEMA = (
    "topic string, segment int, ledger_id long, entry_id long, message_id string, "
    "key string, value binary, publish_time_ms long"
)
COLUMNS = tuple(part.split()[0] for part in SCHEMA.split(", "))
NOTHING = "-1:-1"
"""The end of a range of a segment that held nothing when the read was planned: it reads
nothing (and asks no broker)."""
DEFAULT_ENTRIES_PER_RANGE = 100_000
DEFAULT_TIMEOUT_S = 300.0


class SegmentReadTimeout(TimeoutError):
    """A range of a segment was not read to its end within the ``timeoutS`` option: most
    often a transaction still open in the range (a committed-only reader cannot pass it
    until it ends), or an unreachable broker. The message names the range and how far the
    read got. Also a builtin :class:`TimeoutError`."""


def parse_position(text: str) -> Position:
    """``"L:E"`` as a position; ValueError, naming the text, for anything else."""
    ledger, sep, entry = text.partition(":")
    try:
        if sep and int(ledger) >= 0 and int(entry) >= 0:
            return int(ledger), int(entry)
    except ValueError:
        pass
    raise ValueError(f"segtxn source: {text!r} is not a position (LEDGER:ENTRY)")


def show(position: Position) -> str:
    return f"{position[0]}:{position[1]}"


def following(position: Position) -> Position:
    """The position just after ``position`` (a reader started there reads on from the next
    entry, in this ledger or the next one)."""
    return position[0], position[1] + 1


def before(position: Position) -> Position:
    """The last position before ``position`` (the end of the previous ledger before an
    entry 0)."""
    if position[1] == 0:
        return position[0] - 1, LAST_ENTRY
    return position[0], position[1] - 1


def split(
    start: Position, end: Position, entries_per_range: int
) -> list[tuple[Position, Position]]:
    """``start .. end`` (inclusive) as consecutive ranges that cover it exactly once: each
    ledger before ``end``'s its own range, ``end``'s ledger cut every ``entries_per_range``
    entries. Empty when ``end < start``.

    Raises:
        ValueError: ``entries_per_range`` is not positive.
    """
    if entries_per_range < 1:
        raise ValueError(f"segtxn source: rangeEntries must be positive, not {entries_per_range}")
    if end < start:
        return []
    cuts = [(ledger, 0) for ledger in range(start[0] + 1, end[0] + 1)]
    first_entry = start[1] if start[0] == end[0] else 0
    cuts += [
        (end[0], e) for e in range(first_entry + entries_per_range, end[1] + 1, entries_per_range)
    ]
    bounds = [start, *cuts]
    ends = [before(c) for c in cuts] + [end]
    return list(zip(bounds, ends, strict=True))


@dataclass(frozen=True)
class Range:
    """One input partition's value: ``segment`` of ``topic`` from ``start`` to ``end``
    (``LEDGER:ENTRY``, inclusive). ``read_as`` is the name the rows carry in their ``topic``
    column (the scalable topic's, for a segment of one)."""

    topic: str
    segment: int
    start: str
    end: str
    read_as: str


def column_names(option: str | None) -> tuple[str, ...]:
    """The ``columns`` option (names separated by commas) as columns in schema order; all of
    them when it is not given.

    Raises:
        ValueError: an unknown or no column.
    """
    if option is None:
        return COLUMNS
    wanted = {name.strip() for name in option.split(",") if name.strip()}
    unknown = sorted(wanted - set(COLUMNS))
    if unknown or not wanted:
        raise ValueError(
            f"segtxn source: columns {option!r}: choose among {', '.join(COLUMNS)}"
            + (f" (not {', '.join(unknown)})" if unknown else "")
        )
    return tuple(c for c in COLUMNS if c in wanted)


def schema_of(columns: Sequence[str]) -> str:
    types = dict(part.split() for part in SCHEMA.split(", "))
    return ", ".join(f"{c} {types[c]}" for c in columns)


async def read_range(
    url: str, partition: Range, columns: Sequence[str], timeout_s: float
) -> list[tuple[Any, ...]]:
    """The committed messages of one range as rows of ``columns``, in the segment's order.

    Raises:
        SegmentReadTimeout: not read to the end within ``timeout_s``.
        segtxn.client errors: the segment cannot be read (TopicNotFound, a server error).
    """
    rows: list[tuple[Any, ...]] = []
    if partition.end == NOTHING:
        return rows
    last: Position | None = None
    deadline = asyncio.timeout(timeout_s)
    try:
        async with deadline, Client(url) as client:
            try:
                reader = await client.create_reader(
                    partition.topic, start=partition.start, end=partition.end
                )
            except TopicNotFound:
                if "segment://" not in partition.topic:
                    raise
                # Retired since the read was planned (every subscription consumed it and
                # retention deleted it; docs/scalable-topics.md): nothing left to read.
                return rows
            while True:
                try:
                    message = await reader.receive()
                except TopicEnded:
                    return rows
                id_ = message.message_id
                last = id_.ledger_id, id_.entry_id
                fields = {
                    "topic": partition.read_as,
                    "segment": partition.segment,
                    "ledger_id": id_.ledger_id,
                    "entry_id": id_.entry_id,
                    "message_id": str(id_),
                    "key": message.key,
                    "value": message.value,
                    "publish_time_ms": message.publish_time_ms,
                }
                rows.append(tuple(fields[c] for c in columns))
    except TimeoutError as e:
        if not deadline.expired():
            raise  # the client's own (attaching to the segment took too long): it says so
        got = f"up to {show(last)}" if last is not None else "nothing"
        raise SegmentReadTimeout(
            f"segtxn source: {partition.topic} {partition.start}..{partition.end} not read in "
            f"{timeout_s:g} s (read {len(rows)} messages, {got}): a transaction still open "
            f"in the range holds a committed-only read until it ends; raise the timeoutS "
            f"option or look for the transaction or the broker in its log"
        ) from e
