"""Per-segment load of a scalable topic: rates from two readings of its counters.

Automatic split and merge (:mod:`segtxn.topics.autoscale`) decide on rates — messages and
payload bytes per second, in (stored) and out (delivered over every subscription) — of each
active segment. The brokers already count all four per segment (the ``msgInCounter``,
``bytesInCounter``, ``msgOutCounter`` and ``bytesOutCounter`` of a segment's stats, the
same counters ``/metrics`` exports), and the admin stats of a ``topic://`` gather every
segment's from its home broker in one call. So a rate is the difference of two readings a
window apart divided by the window, computed by whoever decides: no broker keeps a
history, and nothing new is written anywhere per tick.

A segment's counters start again from zero when it is loaded again (its broker restarted,
or it moved): a counter lower than before says so, and that segment has no rate for that
window (rather than a negative or a made-up one). A segment absent from either reading (a
child created by a split in between) has none either.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Load:
    """Rates of one segment over a window (or thresholds on them: the same four axes)."""

    msg_in_per_s: float
    bytes_in_per_s: float
    msg_out_per_s: float
    bytes_out_per_s: float

    def axes(self) -> tuple[float, float, float, float]:
        return (self.msg_in_per_s, self.bytes_in_per_s, self.msg_out_per_s, self.bytes_out_per_s)

    def __add__(self, other: Load) -> Load:
        return Load(*(a + b for a, b in zip(self.axes(), other.axes(), strict=True)))

    def describe(self) -> str:
        return (
            f"{self.msg_in_per_s:.1f} msg/s in, {self.bytes_in_per_s:.0f} B/s in, "
            f"{self.msg_out_per_s:.1f} msg/s out, {self.bytes_out_per_s:.0f} B/s out"
        )


AXES = ("msg/s in", "B/s in", "msg/s out", "B/s out")
"""What each of :meth:`Load.axes` measures, for messages."""


@dataclass(frozen=True)
class Counters:
    """A segment's four cumulative counters at one reading."""

    msg_in: int
    bytes_in: int
    msg_out: int
    bytes_out: int


@dataclass(frozen=True)
class Reading:
    """The counters of a topic's active segments at ``at_s`` (seconds, any clock that does
    not go back; both readings of a window from the same one)."""

    at_s: float
    counters: Mapping[int, Counters]


class MalformedStats(ValueError):
    """A stats answer without the shape of a ``topic://``'s (a broker of another version,
    or not a scalable topic's)."""


def reading(stats: Mapping[str, Any], at_s: float) -> Reading:
    """The counters of the active segments in a ``topic://``'s admin stats answer.

    Raises:
        MalformedStats: a segment or its stats lacks a field this reads.
    """
    counters: dict[int, Counters] = {}
    try:
        for segment in stats["segments"]:
            if segment["state"] != "ACTIVE":
                continue
            found = segment["stats"]
            counters[int(segment["id"])] = Counters(
                int(found["msgInCounter"]),
                int(found["bytesInCounter"]),
                int(found["msgOutCounter"]),
                int(found["bytesOutCounter"]),
            )
    except (KeyError, TypeError, ValueError) as e:
        raise MalformedStats(f"not a scalable topic's stats ({e!r})") from e
    return Reading(at_s, counters)


def rates(before: Reading, after: Reading) -> dict[int, Load]:
    """Each segment's rates between the two readings: those in both, with no counter
    lower in ``after`` (reloaded meanwhile). Empty when no time passed between them."""
    window = after.at_s - before.at_s
    if window <= 0:
        return {}
    out: dict[int, Load] = {}
    for segment, now in after.counters.items():
        then = before.counters.get(segment)
        if then is None:
            continue
        deltas = (
            now.msg_in - then.msg_in,
            now.bytes_in - then.bytes_in,
            now.msg_out - then.msg_out,
            now.bytes_out - then.bytes_out,
        )
        if min(deltas) < 0:
            continue
        out[segment] = Load(*(d / window for d in deltas))
    return out
