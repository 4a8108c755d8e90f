"""The segment DAG's operations keep its invariants, whatever sequence is applied."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from segtxn.protocol.hashing import HASH_SPACE
from segtxn.topics import dag
from segtxn.topics.model import ScalableTopic, SegmentState, new_scalable_topic


@st.composite
def evolved(draw: st.DrawFn) -> ScalableTopic:
    topic = new_scalable_topic(0, draw(st.integers(1, 8)))
    for _ in range(draw(st.integers(0, 25))):
        active = topic.active()
        if draw(st.booleans()) or len(active) < 2:
            segment = draw(st.sampled_from(active))
            if segment.lo == segment.hi:
                continue
            at = draw(st.one_of(st.none(), st.integers(segment.lo + 1, segment.hi)))
            op = dag.plan_split(topic, segment.id, at)
        else:
            i = draw(st.integers(0, len(active) - 2))
            op = dag.plan_merge(topic, active[i + 1].id, active[i].id)
        topic = dag.complete(topic, op)
    return topic


@settings(max_examples=200, deadline=None)
@given(evolved())
def test_invariants_hold_after_any_sequence(topic: ScalableTopic) -> None:
    dag.check(topic)  # raises on any broken invariant
    active = topic.active()
    assert sum(s.hi - s.lo + 1 for s in active) == HASH_SPACE
    for key_hash in (0, 1, HASH_SPACE // 2, HASH_SPACE - 1):
        assert topic.route(key_hash).covers(key_hash)
    order = [s.id for s in dag.ancestors_first(topic)]
    assert sorted(order) == sorted(s.id for s in topic.segments)
    position = {sid: i for i, sid in enumerate(order)}
    for segment in topic.segments:
        assert all(position[p] < position[segment.id] for p in segment.parents)


def test_split_and_merge_shapes() -> None:
    topic = new_scalable_topic(0, 2)
    split = dag.complete(topic, dag.plan_split(topic, 0))
    assert [(s.id, s.lo, s.hi) for s in split.active()] == [
        (2, 0, 0x3FFF),
        (3, 0x4000, 0x7FFF),
        (1, 0x8000, 0xFFFF),
    ]
    parent = split.segment(0)
    assert parent is not None and parent.state is SegmentState.SEALED
    assert split.epoch == 1 and split.next_segment_id == 4
    merged = dag.complete(split, dag.plan_merge(split, 3, 1))
    child = merged.segment(4)
    assert child is not None and (child.lo, child.hi, child.parents) == (0x4000, 0xFFFF, [3, 1])


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (lambda t: dag.plan_split(t, 9), "does not exist"),
        (lambda t: dag.plan_split(t, 0, at=0), "within"),
        (lambda t: dag.plan_merge(t, 0, 0), "itself"),
        (lambda t: dag.plan_merge(t, 0, 2), "not adjacent"),
    ],
)
def test_bad_operations_are_refused(action: object, message: str) -> None:
    topic = new_scalable_topic(0, 3)
    with pytest.raises(dag.DagError, match=message):
        action(topic)  # type: ignore[operator]


def test_sealed_segments_cannot_be_split_again() -> None:
    topic = new_scalable_topic(0, 1)
    topic = dag.complete(topic, dag.plan_split(topic, 0))
    with pytest.raises(dag.DagError, match="sealed"):
        dag.plan_split(topic, 0)


@settings(max_examples=60, deadline=None)
@given(evolved(), st.randoms(use_true_random=False))
def test_retiring_and_pruning_sealed_segments_in_any_order_keeps_the_invariants(
    topic: ScalableTopic, rnd: random.Random
) -> None:
    """Sealed segments retire parents first (a random such order; a child before its
    parent is refused); each pass prunes what has no parent left, and in the end every
    sealed segment is gone while the active ones still tile the space."""
    active = [(s.id, s.lo, s.hi) for s in topic.active()]
    while sealed := [s for s in topic.segments if s.state is SegmentState.SEALED]:
        ready = [s for s in sealed if all(
            (p := topic.segment(x)) is None or p.state is SegmentState.RETIRED for x in s.parents
        )]  # fmt: skip
        blocked = [s for s in sealed if s not in ready]
        if blocked:
            with pytest.raises(dag.DagError, match="parent"):
                dag.retire(topic, rnd.choice(blocked).id)
        topic = dag.retire(topic, rnd.choice(ready).id)
        dag.check(topic)
        for prunable in dag.prunable(topic):
            topic = dag.prune(topic, prunable)
    while left := dag.prunable(topic):
        topic = dag.prune(topic, left[0])
    assert [s.state for s in topic.segments] == [SegmentState.ACTIVE] * len(active)
    assert [(s.id, s.lo, s.hi) for s in topic.active()] == active
    assert all(not s.parents for s in topic.segments)  # every ancestor pruned


def test_only_a_sealed_segment_retires_and_only_a_parentless_retired_one_is_pruned() -> None:
    topic = dag.complete(new_scalable_topic(0, 1), dag.plan_split(new_scalable_topic(0, 1), 0))
    topic = dag.complete(topic, dag.plan_split(topic, 1))  # 0 -> 1, 2; 1 -> 3, 4
    with pytest.raises(dag.DagError, match="not sealed"):
        dag.retire(topic, 2)  # active
    with pytest.raises(dag.DagError, match="parent"):
        dag.retire(topic, 1)  # parents first: 0 is not retired
    first = dag.retire(topic, 0)
    with pytest.raises(dag.DagError, match="not sealed"):
        dag.retire(first, 0)  # once
    both = dag.retire(first, 1)
    assert dag.prunable(both) == [0]  # 1 waits for its parent to leave
    with pytest.raises(dag.DagError):
        dag.prune(both, 1)
    pruned = dag.prune(both, 0)
    assert pruned.segment(0) is None and pruned.segment(1).parents == []  # type: ignore[union-attr]
    assert dag.prunable(pruned) == [1]
    assert pruned.epoch == topic.epoch  # routes did not change
