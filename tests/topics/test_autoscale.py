"""The automatic split/merge decision (segtxn/topics/autoscale.py) and the rates it reads
(segtxn/topics/segmentload.py), rule by rule: pure functions, no I/O."""

from __future__ import annotations

from typing import Any

import pytest

from segtxn.topics.autoscale import (
    Action,
    History,
    Policy,
    PolicyError,
    Why,
    decide,
    merge_depth,
    policy_from,
    segments_of,
    track_cold,
)
from segtxn.topics.model import SegmentInfo, SegmentState
from segtxn.topics.segmentload import Counters, Load, MalformedStats, Reading, rates, reading

POLICY = Policy(
    split=Load(100, 10_000, 1_000, 100_000),
    merge=Load(10, 1_000, 100, 10_000),
    split_cooldown_s=60,
    merge_cooldown_s=300,
    merge_window_s=120,
    max_segments=8,
    min_segments=1,
    max_dag_depth=2,
)
IDLE = Load(0, 0, 0, 0)
WARM = Load(50, 5_000, 500, 50_000)  # between the thresholds: neither hot nor cold
HOT = Load(150, 5_000, 0, 0)  # msg/s in over its split threshold only
NOW = 10_000.0


def seg(
    id_: int, lo: int, hi: int, *, sealed: bool = False, parents: tuple[int, ...] = ()
) -> SegmentInfo:
    state = SegmentState.SEALED if sealed else SegmentState.ACTIVE
    return SegmentInfo(id=id_, lo=lo, hi=hi, state=state, parents=list(parents))


TWO = [
    seg(0, 0, 0xFFFF, sealed=True),
    seg(1, 0, 0x7FFF, parents=(0,)),
    seg(2, 0x8000, 0xFFFF, parents=(0,)),
]
COLD_LONG = History(cold_since_s={1: NOW - 500, 2: NOW - 500})


# ---------------------------------------------------------------------- splits


def test_a_segment_past_a_split_threshold_is_split() -> None:
    d = decide(TWO, {1: WARM, 2: HOT}, POLICY, History(), NOW)
    assert (d.action, d.segments, d.why) == (Action.SPLIT, (2,), Why.HOT)
    assert "150.0 msg/s in > 100" in d.message


def test_below_every_split_threshold_nothing_is_split() -> None:
    d = decide(TWO, {1: WARM, 2: WARM}, POLICY, History(), NOW)
    assert (d.action, d.why) == (Action.NONE, Why.STEADY)


@pytest.mark.parametrize(
    "load", [Load(0, 10_001, 0, 0), Load(0, 0, 1_001, 0), Load(0, 0, 0, 100_001)]
)
def test_every_axis_can_make_a_segment_hot(load: Load) -> None:
    assert decide(TWO, {1: load, 2: WARM}, POLICY, History(), NOW).segments == (1,)


def test_the_hottest_segment_is_split_first() -> None:
    # 2 is 1.5x past its msg/s threshold, 1 is 3x past its bytes/s one
    d = decide(TWO, {1: Load(0, 30_000, 0, 0), 2: HOT}, POLICY, History(), NOW)
    assert d.segments == (1,)


def test_the_split_cooldown_holds_then_lets_go() -> None:
    during = decide(TWO, {2: HOT}, POLICY, History(last_split_s=NOW - 59), NOW)
    assert (during.action, during.why) == (Action.NONE, Why.SPLIT_COOLDOWN)
    assert "next in 1 s" in during.message
    after = decide(TWO, {2: HOT}, POLICY, History(last_split_s=NOW - 60), NOW)
    assert after.action is Action.SPLIT


def test_no_split_at_max_segments() -> None:
    capped = Policy(split=POLICY.split, merge=POLICY.merge, max_segments=2)
    d = decide(TWO, {2: HOT}, capped, History(), NOW)
    assert (d.action, d.why) == (Action.NONE, Why.MAX_SEGMENTS)


def test_a_one_hash_segment_is_not_split_the_next_hottest_is() -> None:
    narrow = [seg(1, 0, 0), seg(2, 1, 0xFFFF)]
    hotter = Load(1_000, 0, 0, 0)
    assert decide(narrow, {1: hotter, 2: HOT}, POLICY, History(), NOW).segments == (2,)
    only = decide(narrow, {1: hotter, 2: WARM}, POLICY, History(), NOW)
    assert (only.action, only.why) == (Action.NONE, Why.UNSPLITTABLE)


def test_depth_never_blocks_a_split() -> None:
    deep = Policy(split=POLICY.split, merge=POLICY.merge, max_dag_depth=0)
    assert decide(TWO, {2: HOT}, deep, History(), NOW).action is Action.SPLIT


def test_no_load_measured_is_no_decision() -> None:
    d = decide(TWO, {}, POLICY, History(), NOW)
    assert (d.action, d.why) == (Action.NONE, Why.NO_LOAD)


# ---------------------------------------------------------------------- merges


def test_two_adjacent_segments_cold_for_the_window_merge() -> None:
    d = decide(TWO, {1: IDLE, 2: IDLE}, POLICY, COLD_LONG, NOW)
    assert (d.action, d.segments, d.why) == (Action.MERGE, (1, 2), Why.COLD)


def test_cold_for_less_than_the_window_is_not_merged() -> None:
    history = History(cold_since_s={1: NOW - 500, 2: NOW - 100})
    d = decide(TWO, {1: IDLE, 2: IDLE}, POLICY, history, NOW)
    assert (d.action, d.why) == (Action.NONE, Why.NOT_COLD_LONG_ENOUGH)
    assert "cold for 100 s of the 120 s" in d.message


def test_only_adjacent_cold_segments_merge() -> None:
    three = [seg(1, 0, 0x3FFF), seg(2, 0x4000, 0x7FFF), seg(3, 0x8000, 0xFFFF)]
    history = History(cold_since_s=dict.fromkeys((1, 2, 3), 0.0))
    # 1 and 3 are cold but not adjacent; 2 between them is warm
    d = decide(three, {1: IDLE, 2: WARM, 3: IDLE}, POLICY, history, NOW)
    assert (d.action, d.why) == (Action.NONE, Why.STEADY)
    # 2 and 3 cold: they merge, not 1 and 3
    d = decide(three, {1: WARM, 2: IDLE, 3: IDLE}, POLICY, history, NOW)
    assert d.segments == (2, 3)


def test_the_coldest_adjacent_pair_merges() -> None:
    three = [seg(1, 0, 0x3FFF), seg(2, 0x4000, 0x7FFF), seg(3, 0x8000, 0xFFFF)]
    history = History(cold_since_s=dict.fromkeys((1, 2, 3), 0.0))
    loads = {1: Load(5, 0, 0, 0), 2: Load(1, 0, 0, 0), 3: Load(0, 0, 0, 0)}
    assert decide(three, loads, POLICY, history, NOW).segments == (2, 3)


def test_a_segment_without_a_rate_does_not_merge() -> None:
    d = decide(TWO, {1: IDLE}, POLICY, COLD_LONG, NOW)
    assert (d.action, d.why) == (Action.NONE, Why.STEADY)


def test_the_merge_cooldown_holds() -> None:
    history = History(last_merge_s=NOW - 299, cold_since_s=COLD_LONG.cold_since_s)
    d = decide(TWO, {1: IDLE, 2: IDLE}, POLICY, history, NOW)
    assert (d.action, d.why) == (Action.NONE, Why.MERGE_COOLDOWN)


def test_no_merge_at_min_segments() -> None:
    floor = Policy(split=POLICY.split, merge=POLICY.merge, min_segments=2, merge_window_s=0)
    d = decide(TWO, {1: IDLE, 2: IDLE}, floor, COLD_LONG, NOW)
    assert (d.action, d.why) == (Action.NONE, Why.MIN_SEGMENTS)


def test_a_hot_segment_anywhere_holds_every_merge() -> None:
    three = [seg(1, 0, 0x3FFF), seg(2, 0x4000, 0x7FFF), seg(3, 0x8000, 0xFFFF)]
    history = History(last_split_s=NOW, cold_since_s=dict.fromkeys((1, 2, 3), 0.0))
    d = decide(three, {1: IDLE, 2: IDLE, 3: HOT}, POLICY, history, NOW)
    assert (d.action, d.why) == (Action.NONE, Why.SPLIT_COOLDOWN)


def test_a_pair_whose_union_would_be_hot_does_not_merge() -> None:
    loose = Policy(split=Load(100, 10_000, 1_000, 100_000), merge=Load(60, 1_000, 100, 10_000),
                   merge_window_s=0)  # fmt: skip
    d = decide(TWO, {1: Load(55, 0, 0, 0), 2: Load(55, 0, 0, 0)}, loose, COLD_LONG, NOW)
    assert (d.action, d.why) == (Action.NONE, Why.STEADY)
    assert "union" in d.message


def test_merge_depth_counts_merges_in_a_lineage() -> None:
    # 0 split into 1, 2; merged into 3; split into 4, 5; 4 and 5 merged into 6
    dag = [
        seg(0, 0, 0xFFFF, sealed=True),
        seg(1, 0, 0x7FFF, sealed=True, parents=(0,)),
        seg(2, 0x8000, 0xFFFF, sealed=True, parents=(0,)),
        seg(3, 0, 0xFFFF, sealed=True, parents=(1, 2)),
        seg(4, 0, 0x7FFF, sealed=True, parents=(3,)),
        seg(5, 0x8000, 0xFFFF, sealed=True, parents=(3,)),
        seg(6, 0, 0xFFFF, parents=(4, 5)),
    ]
    assert merge_depth(dag) == {0: 0, 1: 0, 2: 0, 3: 1, 4: 1, 5: 1, 6: 2}


def test_max_dag_depth_stops_merges_of_a_deep_lineage() -> None:
    dag = [
        seg(0, 0, 0xFFFF, sealed=True),
        seg(1, 0, 0x7FFF, sealed=True, parents=(0,)),
        seg(2, 0x8000, 0xFFFF, sealed=True, parents=(0,)),
        seg(3, 0, 0xFFFF, sealed=True, parents=(1, 2)),
        seg(4, 0, 0x7FFF, parents=(3,)),
        seg(5, 0x8000, 0xFFFF, parents=(3,)),
    ]
    history = History(cold_since_s={4: 0.0, 5: 0.0})
    shallow = Policy(split=POLICY.split, merge=POLICY.merge, merge_window_s=0, max_dag_depth=1)
    d = decide(dag, {4: IDLE, 5: IDLE}, shallow, history, NOW)
    assert (d.action, d.why) == (Action.NONE, Why.MAX_DAG_DEPTH)
    assert decide(dag, {4: IDLE, 5: IDLE}, POLICY, history, NOW).action is Action.MERGE


def test_track_cold_keeps_the_first_since_and_forgets_a_warm_segment() -> None:
    first = track_cold(None, {1: IDLE, 2: IDLE}, POLICY, 100.0)
    assert first == {1: 100.0, 2: 100.0}
    later = track_cold(first, {1: IDLE, 2: WARM, 3: IDLE}, POLICY, 130.0)
    assert later == {1: 100.0, 3: 130.0}
    assert track_cold(later, {}, POLICY, 160.0) == {}


# ---------------------------------------------------------------------- policy


def test_policy_from_a_spec_keeps_defaults_for_what_is_absent() -> None:
    spec = {"split": {"msgRateIn": 50, "cooldownSeconds": 5}, "merge": {"msgRateIn": 5},
            "maxSegments": 4}  # fmt: skip
    p = policy_from(spec)
    assert (p.split.msg_in_per_s, p.split_cooldown_s, p.max_segments) == (50, 5, 4)
    assert p.merge.msg_in_per_s == 5 and p.merge.bytes_in_per_s == Policy().merge.bytes_in_per_s
    assert p.merge_window_s == 300 and p.max_dag_depth == 10


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"split": {"msgRateIn": 500}}, r"merge threshold \(1000 msg/s in\) must be below"),
        ({"minSegments": 5, "maxSegments": 4}, "minSegments"),
        ({"merge": {"windowSeconds": -1}}, "cannot be negative"),
        ({"maxSegments": "many"}, "autoscale"),
        ({"split": 5}, "split is an object of thresholds .*, not int"),
        ({"merge": ["msgRateIn"]}, "merge is an object of thresholds .*, not list"),
    ],
)
def test_a_policy_that_cannot_work_is_refused(spec: dict[str, Any], says: str) -> None:
    with pytest.raises(PolicyError, match=says):
        policy_from(spec)


# ---------------------------------------------------------------------- rates


def _stats(*segments: tuple[int, str, int, int]) -> dict[str, Any]:
    return {
        "segments": [
            {
                "id": i,
                "range": [0, 0xFFFF],
                "state": state,
                "parents": [],
                "children": [],
                "stats": {
                    "msgInCounter": m,
                    "bytesInCounter": b,
                    "msgOutCounter": 2 * m,
                    "bytesOutCounter": 2 * b,
                },
            }
            for i, state, m, b in segments
        ]
    }


def test_rates_are_counter_differences_over_the_window() -> None:
    before = reading(_stats((1, "ACTIVE", 100, 1000), (2, "ACTIVE", 0, 0)), 10.0)
    after = reading(
        _stats((1, "ACTIVE", 300, 5000), (2, "ACTIVE", 10, 10), (3, "ACTIVE", 9, 9)), 20.0
    )
    found = rates(before, after)
    assert found[1] == Load(20, 400, 40, 800)
    assert found[2] == Load(1, 1, 2, 2)
    assert 3 not in found  # no earlier reading


def test_a_reloaded_segment_has_no_rate_for_that_window() -> None:
    before = Reading(0.0, {1: Counters(100, 100, 0, 0)})
    after = Reading(10.0, {1: Counters(5, 500, 0, 0)})
    assert rates(before, after) == {}
    assert rates(after, after) == {}  # no time passed


def test_sealed_segments_are_not_read_and_a_bad_answer_is_refused() -> None:
    assert set(reading(_stats((1, "SEALED", 1, 1), (2, "ACTIVE", 1, 1)), 0).counters) == {2}
    with pytest.raises(MalformedStats):
        reading({"segments": [{"id": 1, "state": "ACTIVE", "stats": None}]}, 0)


def test_segments_of_a_dag_answer() -> None:
    dag = {
        "segments": [
            {"id": 3, "range": [0, 9], "state": "SEALED", "parents": [1, 2], "children": [4]}
        ]
    }
    (s,) = segments_of(dag)
    assert (s.id, s.lo, s.hi, s.state, s.parents, s.children) == (
        3,
        0,
        9,
        SegmentState.SEALED,
        [1, 2],
        [4],
    )
