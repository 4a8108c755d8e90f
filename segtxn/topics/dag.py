"""The segment DAG of a scalable topic: pure operations on its record, and their invariants.

A split seals one active segment and adds two children covering its range (at its midpoint
or at a given hash); a merge seals two adjacent active segments and adds one child covering
both. Every operation bumps the epoch and takes child ids from ``next_segment_id``.

Invariants (checked by :func:`check`, property-tested):

- the ACTIVE segments tile the hash space 0x0000-0xFFFF exactly: sorted by range, each starts
  right after the previous one ends, no overlap, no gap;
- every SEALED segment's range is covered by its children's (contiguous) ranges — exactly
  for a split, by a wider child for a merge — and each child lists it among its parents;
- ids are unique and below ``next_segment_id``;
- a RETIRED segment (:func:`retire`, parents first) is a sealed one whose data is gone; it
  stays in the record, covered by its children like a sealed one, until :func:`prune`
  removes it, also parents first: a segment is pruned only once none of its parents is
  left, so the coverage of what remains always holds.

An operation is first *planned* (the record gains a :class:`PendingOp` with the child ids and
ranges decided), then *completed* (parents sealed, children active). The controller writes the
planned record before it seals anything, so a controller that dies half-way leaves an intent
its successor finishes, never a half-done topology.
"""

from __future__ import annotations

import itertools

import msgspec

from segtxn.protocol.hashing import HASH_SPACE
from segtxn.topics.model import OpKind, PendingOp, ScalableTopic, SegmentInfo, SegmentState


class DagError(ValueError):
    """An operation that does not fit the DAG (the message says why)."""


def _active(topic: ScalableTopic, segment_id: int) -> SegmentInfo:
    if topic.deleting:
        raise DagError("the topic is being deleted")
    segment = topic.segment(segment_id)
    if segment is None:
        raise DagError(f"segment {segment_id} does not exist")
    if segment.state is not SegmentState.ACTIVE:
        raise DagError(f"segment {segment_id} is sealed (it was split or merged)")
    return segment


def plan_split(topic: ScalableTopic, segment_id: int, at: int | None = None) -> PendingOp:
    """Split ``segment_id`` into [lo, at-1] and [at, hi] (``at`` defaults to the midpoint).

    Raises:
        DagError: no such active segment, a one-hash segment, or ``at`` outside (lo, hi].
    """
    segment = _active(topic, segment_id)
    if segment.lo == segment.hi:
        raise DagError(f"segment {segment_id} covers a single hash: it cannot be split")
    at = (segment.lo + segment.hi + 1) // 2 if at is None else at
    if not segment.lo < at <= segment.hi:
        raise DagError(
            f"split point {at:#06x} must be within ({segment.lo:#06x}, {segment.hi:#06x}]"
        )
    first = topic.next_segment_id
    return PendingOp(
        OpKind.SPLIT,
        [segment_id],
        [(first, segment.lo, at - 1), (first + 1, at, segment.hi)],
    )


def plan_merge(topic: ScalableTopic, first_id: int, second_id: int) -> PendingOp:
    """Merge two adjacent active segments into one.

    Raises:
        DagError: not both active, the same segment, or not adjacent.
    """
    if first_id == second_id:
        raise DagError("a segment cannot be merged with itself")
    a, b = sorted((_active(topic, first_id), _active(topic, second_id)), key=lambda s: s.lo)
    if a.hi + 1 != b.lo:
        raise DagError(f"segments {a.id} and {b.id} are not adjacent: only neighbours merge")
    return PendingOp(OpKind.MERGE, [a.id, b.id], [(topic.next_segment_id, a.lo, b.hi)])


def complete(topic: ScalableTopic, op: PendingOp) -> ScalableTopic:
    """The topic after ``op``: parents sealed, children active, epoch + 1."""
    epoch = topic.epoch + 1
    children = [c[0] for c in op.children]
    segments = [
        msgspec.structs.replace(
            segment, state=SegmentState.SEALED, children=children, sealed_epoch=epoch
        )
        if segment.id in op.parents
        else segment
        for segment in topic.segments
    ]
    segments += [
        SegmentInfo(child, lo, hi, parents=list(op.parents), created_epoch=epoch)
        for child, lo, hi in op.children
    ]
    done = msgspec.structs.replace(
        topic,
        epoch=epoch,
        next_segment_id=max(topic.next_segment_id, max(children) + 1),
        segments=segments,
        pending=None,
    )
    check(done)
    return done


def retire(topic: ScalableTopic, segment_id: int) -> ScalableTopic:
    """The topic with sealed segment ``segment_id`` RETIRED: its data and state are being
    deleted (every subscription consumed it and retention let it go). Nothing reads a
    RETIRED segment again: consumers count it done. Segments retire parents first: a
    subscription reads a child only after its parents, so while a parent is not retired a
    subscription may still be on its way to the child. The epoch is kept (no route
    changes).

    Raises:
        DagError: no such segment, it is not SEALED, or a parent of it is not retired.
    """
    segment = topic.segment(segment_id)
    if segment is None or segment.state is not SegmentState.SEALED:
        raise DagError(f"segment {segment_id} is not sealed: only a sealed segment retires")
    parents = [topic.segment(p) for p in segment.parents]
    if any(p is not None and p.state is not SegmentState.RETIRED for p in parents):
        raise DagError(f"segment {segment_id} has a parent that is not retired")
    return msgspec.structs.replace(
        topic,
        segments=[
            msgspec.structs.replace(s, state=SegmentState.RETIRED) if s.id == segment_id else s
            for s in topic.segments
        ],
    )


def prunable(topic: ScalableTopic) -> list[int]:
    """The RETIRED segments none of whose parents is left in the record."""
    present = {s.id for s in topic.segments}
    return [
        s.id
        for s in topic.segments
        if s.state is SegmentState.RETIRED and not present.intersection(s.parents)
    ]


def prune(topic: ScalableTopic, segment_id: int) -> ScalableTopic:
    """The topic without RETIRED segment ``segment_id`` (one of :func:`prunable`), its id
    gone from its children's ``parents``: the record stops growing with the topic's
    history.

    Raises:
        DagError: not a prunable segment.
    """
    if segment_id not in prunable(topic):
        raise DagError(f"segment {segment_id} is not retired, or a parent of it is left")
    pruned = msgspec.structs.replace(
        topic,
        segments=[
            msgspec.structs.replace(s, parents=[p for p in s.parents if p != segment_id])
            for s in topic.segments
            if s.id != segment_id
        ],
    )
    check(pruned)
    return pruned


def check(topic: ScalableTopic) -> None:
    """Raise DagError if an invariant (see the module docstring) does not hold."""
    ids = [s.id for s in topic.segments]
    if len(set(ids)) != len(ids):
        raise DagError("duplicate segment ids")
    if ids and max(ids) >= topic.next_segment_id:
        raise DagError("a segment id is not below next_segment_id")
    expected = 0
    for segment in topic.active():
        if segment.lo != expected or segment.hi < segment.lo:
            raise DagError(f"active segments do not tile the hash space at {expected:#06x}")
        expected = segment.hi + 1
    if expected != HASH_SPACE:
        raise DagError("active segments do not reach the end of the hash space")
    by_id = {s.id: s for s in topic.segments}
    for segment in topic.segments:
        if segment.state is SegmentState.ACTIVE:
            continue
        children = sorted((by_id[c] for c in segment.children), key=lambda s: s.lo)
        contiguous = all(a.hi + 1 == b.lo for a, b in itertools.pairwise(children))
        if (
            not children
            or not contiguous
            or children[0].lo > segment.lo
            or children[-1].hi < segment.hi
        ):
            raise DagError(f"sealed segment {segment.id} is not covered by its children")
        if any(segment.id not in c.parents for c in children):
            raise DagError(f"a child of {segment.id} does not list it as a parent")


SHAPE_LIMIT = 32
"""Segments named per list in a log line; the rest are counted (a line stays short)."""


def _bounded(parts: list[str]) -> str:
    if len(parts) <= SHAPE_LIMIT:
        return ", ".join(parts)
    return ", ".join(parts[:SHAPE_LIMIT]) + f", ... (+{len(parts) - SHAPE_LIMIT} more)"


def describe(segments: list[SegmentInfo]) -> str:
    """Segments as log lines name them: ``2 [0x0000-0x7fff], 3 [0x8000-0xffff]``."""
    return _bounded([f"{s.id} [{s.lo:#06x}-{s.hi:#06x}]" for s in segments])


def shape(topic: ScalableTopic) -> str:
    """The DAG in one line: the active segments by range, then the sealed ones (newest
    first) with their children: ``active 1 [...], 2 [...], 3 [...]; sealed 0->2,3``."""
    sealed = sorted(
        (s for s in topic.segments if s.state is SegmentState.SEALED), key=lambda s: -s.id
    )
    text = "active " + describe(topic.active())
    if sealed:
        text += "; sealed " + _bounded(
            [f"{s.id}->{'+'.join(map(str, s.children))}" for s in sealed]
        )
    return text


def ancestors_first(topic: ScalableTopic) -> list[SegmentInfo]:
    """Every segment, each after all of its parents (the order consumers must follow)."""
    by_id = {s.id: s for s in topic.segments}
    done: set[int] = set()
    order: list[SegmentInfo] = []

    def visit(segment: SegmentInfo) -> None:
        if segment.id in done:
            return
        for parent in segment.parents:
            visit(by_id[parent])
        done.add(segment.id)
        order.append(segment)

    for segment in sorted(topic.segments, key=lambda s: s.id):
        visit(segment)
    return order
