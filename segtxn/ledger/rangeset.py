"""A compact set of positions: sorted, disjoint, closed ranges.

A cursor's individually acknowledged entries beyond its mark-delete position are usually a
few runs ("acked 5..90 and 93..120"), so they are kept as ranges, not as single positions.
Two positions are adjacent when they are consecutive entries of one ledger; the set keeps
its ranges maximal (adjacent or overlapping ranges are merged), so equal sets have equal
representations.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator

from segtxn.ledger.position import Position

Range = tuple[Position, Position]
_AFTER_ALL = Position(2**63, 0)
"""After every position: a range starting at ``p`` sorts before ``(p, _AFTER_ALL)``."""


class RangeSet:
    def __init__(self, ranges: list[Range] | None = None) -> None:
        self._ranges: list[Range] = []
        for lo, hi in ranges or ():
            self.add_range(lo, hi)

    def __len__(self) -> int:
        """The number of ranges (not of positions)."""
        return len(self._ranges)

    def __iter__(self) -> Iterator[Range]:
        return iter(self._ranges)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RangeSet) and self._ranges == other._ranges

    def __repr__(self) -> str:
        return "RangeSet(" + ", ".join(f"[{lo}..{hi}]" for lo, hi in self._ranges) + ")"

    def count(self) -> int:
        """The number of positions in the set."""
        return sum(hi.entry_id - lo.entry_id + 1 for lo, hi in self._ranges)

    def first(self) -> Range | None:
        return self._ranges[0] if self._ranges else None

    def __contains__(self, position: object) -> bool:
        if not isinstance(position, Position):
            return False
        i = bisect_right(self._ranges, (position, _AFTER_ALL)) - 1
        return i >= 0 and self._ranges[i][0] <= position <= self._ranges[i][1]

    def add(self, position: Position) -> None:
        self.add_range(position, position)

    def add_range(self, lo: Position, hi: Position) -> None:
        """Add every position of one ledger from ``lo`` to ``hi`` inclusive."""
        if lo.ledger_id != hi.ledger_id or hi < lo:
            raise ValueError(f"a range lies within one ledger, lo <= hi: [{lo}..{hi}]")
        ranges = self._ranges
        i = bisect_right(ranges, (lo, lo))
        # merge with a predecessor that overlaps or touches
        if i > 0 and _touches(ranges[i - 1], lo):
            i -= 1
            lo = ranges[i][0]
            hi = max(hi, ranges[i][1])
        j = i
        while j < len(ranges) and _touches((lo, hi), ranges[j][0]):
            hi = max(hi, ranges[j][1])
            j += 1
        ranges[i:j] = [(lo, hi)]

    def remove_up_to(self, position: Position) -> None:
        """Drop every position ``<= position``."""
        ranges = self._ranges
        while ranges and ranges[0][1] <= position:
            ranges.pop(0)
        if ranges and ranges[0][0] <= position:
            lo, hi = ranges[0]
            ranges[0] = (Position(lo.ledger_id, position.entry_id + 1), hi)

    def to_list(self, limit: int) -> list[list[int]]:
        """The first ``limit`` ranges as ``[ledger, first, ledger, last]`` lists."""
        return [[lo[0], lo[1], hi[0], hi[1]] for lo, hi in self._ranges[:limit]]

    @classmethod
    def from_list(cls, items: list[list[int]]) -> RangeSet:
        return cls([(Position(a, b), Position(c, d)) for a, b, c, d in items])


def _touches(existing: Range, position: Position) -> bool:
    """True if ``position`` lies in ``existing`` or right after it in the same ledger."""
    lo, hi = existing
    return lo <= position and (
        position <= hi
        or (position.ledger_id == hi.ledger_id and position.entry_id == hi.entry_id + 1)
    )
