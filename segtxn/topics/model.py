"""Topic records and the range-segment model of scalable topics (PIP-460).

A scalable topic ``topic://t/n/x`` is one record holding its segments. Each segment covers an
inclusive range of the key-hash space 0x0000-0xFFFF; the ACTIVE segments tile that space
exactly, and a keyed message goes to the active segment whose range covers its key's hash.
Splits and merges (a later issue) seal segments and add children; the record keeps the
whole DAG, so consumers can traverse it parents-first.
"""

from __future__ import annotations

import enum

import msgspec

from segtxn.protocol.hashing import HASH_SPACE


class SegmentState(enum.StrEnum):
    ACTIVE = "ACTIVE"
    SEALED = "SEALED"
    RETIRED = "RETIRED"
    """Sealed, consumed by every subscription and past retention: its data and state are
    deleted, and it leaves the record once its parents have (:func:`segtxn.topics.dag.prune`)."""


class SegmentInfo(msgspec.Struct, frozen=True):
    id: int
    lo: int
    """First hash of the range (inclusive)."""
    hi: int
    """Last hash of the range (inclusive)."""
    state: SegmentState = SegmentState.ACTIVE
    parents: list[int] = msgspec.field(default_factory=list)
    children: list[int] = msgspec.field(default_factory=list)
    created_epoch: int = 0
    sealed_epoch: int | None = None

    def covers(self, key_hash: int) -> bool:
        return self.lo <= key_hash <= self.hi


class OpKind(enum.StrEnum):
    SPLIT = "split"
    MERGE = "merge"


class PendingOp(msgspec.Struct, frozen=True):
    """A split or merge decided but not finished (see :mod:`segtxn.topics.dag`)."""

    kind: OpKind
    parents: list[int]
    children: list[tuple[int, int, int]]
    """(id, lo, hi) of each child, decided when the operation was planned."""


class ChangeInfo(msgspec.Struct, frozen=True):
    """The last split or merge: what it did and how long it took (shown in stats)."""

    kind: OpKind
    parents: list[int]
    children: list[int]
    finished_ms: int
    duration_ms: float


class PersistentTopic(msgspec.Struct, frozen=True, tag="persistent"):
    created_ms: int
    properties: dict[str, str] = msgspec.field(default_factory=dict)
    deleting: bool = False
    """The topic is being deleted (its data, then this record): it is not loaded again,
    and the next deletion finishes it (segtxn/broker/deletemark.py)."""


class ScalableTopic(msgspec.Struct, frozen=True, tag="scalable"):
    created_ms: int
    epoch: int
    next_segment_id: int
    segments: list[SegmentInfo]
    properties: dict[str, str] = msgspec.field(default_factory=dict)
    pending: PendingOp | None = None
    """The split or merge in progress, if any (at most one at a time)."""
    last_change: ChangeInfo | None = None
    deleting: bool = False
    """The topic is being deleted (its segments are deleted, then this record): no split or
    merge starts, and only now may a segment of it be deleted."""

    def active(self) -> list[SegmentInfo]:
        return sorted(
            (s for s in self.segments if s.state is SegmentState.ACTIVE), key=lambda s: s.lo
        )

    def route(self, key_hash: int) -> SegmentInfo:
        """The active segment covering ``key_hash``."""
        for segment in self.active():
            if segment.covers(key_hash):
                return segment
        raise ValueError(f"no active segment covers hash {key_hash:#06x}: the DAG is broken")

    def segment(self, segment_id: int) -> SegmentInfo | None:
        for segment in self.segments:
            if segment.id == segment_id:
                return segment
        return None

    def creating(self) -> list[int]:
        """The children of the split or merge in progress: not in the DAG yet, but placed
        and prepared (their ledgers created, with data once the split completes) before it
        completes, so a deletion deletes them too."""
        if self.pending is None:
            return []
        return [child for child, _, _ in self.pending.children if self.segment(child) is None]


TopicRecord = PersistentTopic | ScalableTopic

encode_topic = msgspec.json.Encoder().encode
decode_topic = msgspec.json.Decoder(TopicRecord).decode


class DamagedRecord(ValueError):
    """A topic's record in the metadata store does not decode: written by hand, by a
    version of segtxn that writes another shape, or damaged. The message names its key
    and what is wrong. Not a bug and not retriable: the record stays so until an operator
    writes a readable one (or deletes the topic); servers answer ``PersistenceError``."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(
            f"the record of a topic at {key} in the metadata store does not decode ({reason}): "
            "it was written by hand, by another version of segtxn, or damaged; write a "
            "readable one or delete the topic"
        )
        self.key = key


def read_topic(key: str, value: bytes) -> TopicRecord:
    """The topic record ``value``, stored at ``key``.

    Raises:
        DamagedRecord: it does not decode.
    """
    try:
        return decode_topic(value)
    except msgspec.DecodeError as e:
        raise DamagedRecord(key, str(e)) from e


MAX_INITIAL_SEGMENTS = 256


def initial_segments(count: int) -> list[SegmentInfo]:
    """``count`` segments that split the hash space evenly (the last takes the remainder)."""
    if not 1 <= count <= MAX_INITIAL_SEGMENTS:
        raise ValueError(f"a scalable topic starts with 1-{MAX_INITIAL_SEGMENTS} segments")
    width = HASH_SPACE // count
    return [
        SegmentInfo(i, i * width, HASH_SPACE - 1 if i == count - 1 else (i + 1) * width - 1)
        for i in range(count)
    ]


def new_scalable_topic(created_ms: int, segments: int) -> ScalableTopic:
    infos = initial_segments(segments)
    return ScalableTopic(created_ms, epoch=0, next_segment_id=len(infos), segments=infos)
