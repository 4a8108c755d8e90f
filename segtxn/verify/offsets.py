"""A streaming read's offset: how far each segment of a topic has been read.

The offset is what Spark writes to a streaming query's checkpoint after each micro-batch
and hands back after a restart, so it is plain JSON with a stable shape (segments in id
order)::

    {"topic": "topic://acme/shop/orders",
     "segments": {"0": {"next": "1:58", "done": true}, "2": {"next": "1:0", "done": false}}}

``next`` is the segment's first position not read yet; a segment absent from it has read
nothing (its ``next`` is its first position, ``1:0``). ``done``: the segment is sealed and
read to its last entry, so it is never read again.

Splits and merges (:func:`advance`): a segment appears once the topic's layout names it,
and a segment with parents (a split's children, a merge's result) is read only once every
parent is done. A segment that has left the topic's DAG (retired, then pruned) leaves the
offset too (:func:`forget_pruned`), so an offset stays as small as the live DAG over months
of splits and merges. A key's records then reach a stream in the order the topic holds them: all
of the parent's before any of the child's, the parent's tail and the child's head in one
micro-batch at the latest, in (segment id, position) order there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from segtxn.protocol.names import Domain, TopicName
from segtxn.verify.ranges import (
    FIRST,
    Position,
    Range,
    before,
    following,
    parse_position,
    show,
    split,
)


@dataclass(frozen=True)
class SegmentOffset:
    next: Position
    done: bool = False


NOT_STARTED = SegmentOffset(FIRST)


@dataclass(frozen=True)
class SegmentView:
    """What the topic's stats say of one segment now. ``last``: its last entry (None: it
    holds none); ``known``: False when its broker did not answer (it is then left as it is)."""

    id: int
    parents: tuple[int, ...]
    last: Position | None
    sealed: bool
    known: bool = True


@dataclass(frozen=True)
class StreamOffset:
    topic: str
    segments: Mapping[int, SegmentOffset]

    def get(self, segment: int) -> SegmentOffset:
        return self.segments.get(segment, NOT_STARTED)

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "segments": {
                str(i): {"next": show(self.segments[i].next), "done": self.segments[i].done}
                for i in sorted(self.segments)
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], topic: TopicName) -> StreamOffset:
        """Raises ValueError: not an offset of this source, or one of another topic (a
        checkpoint directory reused for another query)."""
        if data.get("topic") != str(topic) or not isinstance(data.get("segments"), dict):
            raise ValueError(
                f"segtxn source: offset {data!r} is not one of {topic} (a checkpoint of "
                f"another query? give this one its own checkpointLocation)"
            )
        segments: dict[int, SegmentOffset] = {}
        for key, value in data["segments"].items():
            try:
                segments[int(key)] = SegmentOffset(parse_position(value["next"]), value["done"])
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"segtxn source: offset of segment {key}: {value!r}") from e
        return cls(str(topic), segments)


def layout(topic: TopicName, stats: Mapping[str, Any]) -> list[SegmentView]:
    """The segments of ``topic`` from its admin stats, in id order (a ``persistent://``
    topic is one segment, 0)."""
    if topic.domain is not Domain.TOPIC:
        return [_view(0, (), stats)]
    return sorted(
        (
            SegmentView(s["id"], tuple(s.get("parents") or ()), None, sealed=True)
            if s.get("state") == "RETIRED"  # consumed and deleted: nothing to read, done
            else _view(s["id"], tuple(s.get("parents") or ()), s.get("stats"))
            for s in stats["segments"]
        ),
        key=lambda v: v.id,
    )


def _view(segment: int, parents: tuple[int, ...], stats: Mapping[str, Any] | None) -> SegmentView:
    if stats is None:
        return SegmentView(segment, parents, None, False, known=False)
    last = stats.get("lastConfirmedPosition")
    return SegmentView(
        segment, parents, parse_position(last) if last else None, bool(stats.get("sealed"))
    )


def advance(start: StreamOffset, views: list[SegmentView]) -> StreamOffset:
    """The offset after reading everything ``views`` show beyond ``start``: each segment to
    its last entry, except those whose parents are not all done (they wait) and those whose
    broker did not answer. Unchanged segments stay as they are, so a topic with nothing new
    gives ``start`` back (Spark then runs no micro-batch)."""
    segments = dict(start.segments)
    for view in sorted(views, key=lambda v: v.id):
        now = segments.get(view.id, NOT_STARTED)
        if now.done or not view.known:
            continue
        if not all(segments.get(p, NOT_STARTED).done for p in view.parents):
            continue
        moved = now
        if view.last is not None and view.last >= now.next:
            moved = SegmentOffset(following(view.last))
        if view.sealed and (view.last is None or view.last < moved.next):
            moved = SegmentOffset(moved.next, done=True)
        if moved != now:
            segments[view.id] = moved
    return forget_pruned(StreamOffset(start.topic, segments), views)


def forget_pruned(offset: StreamOffset, views: list[SegmentView]) -> StreamOffset:
    """``offset`` without the segments that have left the topic's DAG: absent from
    ``views`` and below its newest id (ids are given in increasing order and never reused,
    and the newest segment is never pruned, so an id above it is one ``views`` has not
    seen yet, and is kept).

    Nothing is read twice or skipped for it: a pruned segment was retired (its data is
    deleted and its broker refuses it, so a stale view of it shows no data to read), and
    no segment lists it as a parent any more, so no child waits for it to be done. An old
    offset (a restarted query's) that names one is fine: it is forgotten at the next
    :func:`advance`, and :func:`ranges` reads only segments the end offset names."""
    present = {v.id for v in views}
    if not present:
        return offset
    newest = max(present)
    kept = {i: o for i, o in offset.segments.items() if i in present or i > newest}
    if len(kept) == len(offset.segments):
        return offset
    return StreamOffset(offset.topic, kept)


def at_latest(topic: TopicName, views: list[SegmentView]) -> StreamOffset:
    """An offset that skips everything stored now (``start=latest``): each segment past its
    last entry, sealed ones done. Segments created later are read from their start."""
    segments = {
        v.id: SegmentOffset(following(v.last) if v.last else FIRST, done=v.sealed)
        for v in views
        if v.known
    }
    return StreamOffset(str(topic), segments)


def ranges(
    topic: TopicName, start: StreamOffset, end: StreamOffset, entries_per_range: int
) -> list[Range]:
    """What lies between two offsets, as ranges of segments (each entry in one range)."""
    out: list[Range] = []
    for segment in sorted(end.segments):
        first, after = start.get(segment).next, end.get(segment).next
        if after <= first:
            continue
        name = str(topic.segment_name(segment)) if topic.domain is Domain.TOPIC else str(topic)
        for a, b in split(first, before(after), entries_per_range):
            out.append(Range(name, segment, show(a), show(b), str(topic)))
    return out
