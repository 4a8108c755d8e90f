"""The report's plot arithmetic: nice ticks, their labels, and labels kept apart."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from segtxn.verify.report.scale import (
    Scale,
    axis_ticks,
    lanes,
    nice_max,
    nice_step,
    text_width,
    tick_label,
    ticks,
)


def test_a_scale_maps_its_domain_onto_its_range_either_way_up() -> None:
    x = Scale(0.0, 60.0, 64.0, 936.0)
    assert (x(0), x(30), x(60)) == (64.0, 500.0, 936.0)
    y = Scale(0.0, 100.0, 200.0, 30.0)  # a y axis grows upwards
    assert (y(0), y(100)) == (200.0, 30.0)
    assert Scale(5.0, 5.0, 10.0, 20.0)(5.0) == 10.0  # a flat domain: no division by zero


@pytest.mark.parametrize(
    ("span", "most", "step"),
    [(100, 5, 20), (7, 5, 2), (0.3, 3, 0.1), (1000, 4, 500), (60, 6, 10), (1, 10, 0.1)],
)
def test_steps_are_one_two_or_five_times_a_power_of_ten(
    span: float, most: int, step: float
) -> None:
    assert nice_step(span, most) == pytest.approx(step)


def test_ticks_fall_on_the_step_and_cover_the_range() -> None:
    assert ticks(0, 100, 5) == [0, 20, 40, 60, 80, 100]
    assert ticks(3, 17, 3) == [5, 10, 15]
    assert nice_max(83) == 100 and nice_max(0) == 1.0


@pytest.mark.parametrize(
    ("value", "step", "label"),
    [(12, 2, "12"), (0.25, 0.05, "0.25"), (1500, 500, "1.5k"), (2000, 1000, "2k"),
     (3_000_000, 1_000_000, "3M"), (1200, 100, "1.2k"), (1250, 50, "1250")],
)  # fmt: skip
def test_tick_labels_are_as_short_as_the_step_allows(value: float, step: float, label: str) -> None:
    assert tick_label(value, step) == label


@given(
    hi=st.floats(min_value=1, max_value=1e7, allow_nan=False),
    length=st.floats(min_value=80, max_value=2000),
)
def test_axis_tick_labels_never_overlap(hi: float, length: float) -> None:
    marks = axis_ticks(0.0, hi, length, 11, " s")
    assert marks and marks[0][0] == 0
    scale = Scale(0.0, hi, 0.0, length)
    for (a, label_a), (b, label_b) in itertools.pairwise(marks):
        # centred labels: half of each must fit between the two ticks
        room = scale(b) - scale(a)
        assert room >= (text_width(label_a, 11) + text_width(label_b, 11)) / 2, marks


def test_spans_that_would_overlap_go_to_different_lanes() -> None:
    # by left edge: (0,50) lane 0; (30,80) overlaps it: lane 1; (40,45) overlaps both:
    # lane 2; (60,90) starts past 50 + the gap: lane 0 again; (200,260): lane 0
    spans = [(0, 50), (30, 80), (60, 90), (200, 260), (40, 45)]
    assert lanes(spans, gap=4) == [0, 1, 0, 0, 2]
    assert lanes([(0, 50), (52, 60)], gap=4) == [0, 1]  # closer than the gap: apart


@given(
    st.lists(
        st.tuples(st.floats(0, 1000), st.floats(1, 200)).map(lambda t: (t[0], t[0] + t[1])),
        max_size=30,
    )
)
def test_no_two_spans_in_one_lane_overlap(spans: list[tuple[float, float]]) -> None:
    placed = lanes(spans, gap=4)
    for i, (left_i, right_i) in enumerate(spans):
        for j, (left_j, right_j) in enumerate(spans[:i]):
            if placed[i] == placed[j]:
                assert right_j + 4 <= left_i or right_i + 4 <= left_j
    assert not spans or set(placed) == set(range(max(placed) + 1))  # no lane left empty
