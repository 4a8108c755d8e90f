"""RangeSet against a plain set of positions: same membership, canonical ranges."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from segtxn.ledger import Position
from segtxn.ledger.rangeset import RangeSet

positions = st.builds(Position, st.integers(1, 3), st.integers(0, 30))
ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), positions, st.integers(0, 5)),
        st.tuples(st.just("cut"), positions, st.just(0)),
    ),
    max_size=60,
)


@given(ops)
def test_matches_a_set_model(operations: list[tuple[str, Position, int]]) -> None:
    ranges = RangeSet()
    model: set[Position] = set()
    for op, position, length in operations:
        if op == "add":
            hi = Position(position.ledger_id, position.entry_id + length)
            ranges.add_range(position, hi)
            span = range(position.entry_id, hi.entry_id + 1)
            model |= {Position(position.ledger_id, e) for e in span}
        else:
            ranges.remove_up_to(position)
            model = {p for p in model if p > position}
    assert {p for p in _all() if p in ranges} == model
    assert ranges.count() == len(model)
    items = list(ranges)
    for (lo, hi), (next_lo, _) in itertools.pairwise(items):
        assert lo <= hi < next_lo  # sorted and disjoint
        assert not (next_lo.ledger_id == hi.ledger_id and next_lo.entry_id == hi.entry_id + 1)
    assert RangeSet.from_list(ranges.to_list(len(items))) == ranges


def _all() -> list[Position]:
    return [Position(ledger, e) for ledger in range(1, 4) for e in range(0, 40)]


def test_ranges_stay_within_a_ledger() -> None:
    with pytest.raises(ValueError, match="within one ledger"):
        RangeSet().add_range(Position(1, 5), Position(2, 0))
    ranges = RangeSet()
    ranges.add(Position(1, 9))
    ranges.add(Position(2, 0))
    assert len(ranges) == 2  # consecutive ledgers are not merged: the set cannot know
