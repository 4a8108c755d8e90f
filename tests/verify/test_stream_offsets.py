"""Stream offsets and ranges without Spark: ranges cover a segment exactly once whatever its
ledgers, offsets survive JSON, and a child segment waits for its parents."""

from __future__ import annotations

import json

import pytest

from segtxn.protocol.names import TopicName
from segtxn.verify.offsets import (
    SegmentOffset,
    SegmentView,
    StreamOffset,
    advance,
    at_latest,
    ranges,
)
from segtxn.verify.ranges import LAST_ENTRY, column_names, split

TOPIC = TopicName.parse("topic://t/ns/orders")


def covered(
    cuts: list[tuple[tuple[int, int], tuple[int, int]]], ledgers: dict[int, int]
) -> list[tuple[int, int]]:
    """The entries of a segment whose ledger ``L`` holds ``ledgers[L]`` entries that each cut
    covers, in order."""
    out: list[tuple[int, int]] = []
    for start, end in cuts:
        out += [
            (lg, e)
            for lg, n in sorted(ledgers.items())
            for e in range(n)
            if start <= (lg, e) <= end
        ]
    return out


@pytest.mark.parametrize(
    ("start", "end", "ledgers"),
    [
        ((1, 0), (1, 99), {1: 100}),
        ((1, 37), (1, 99), {1: 100}),
        ((1, 0), (4, 12), {1: 40, 2: 0, 3: 7, 4: 13}),
        ((2, 5), (4, 0), {1: 40, 2: 9, 3: 7, 4: 13}),
    ],
)
def test_split_covers_every_entry_exactly_once(
    start: tuple[int, int], end: tuple[int, int], ledgers: dict[int, int]
) -> None:
    every = [
        (lg, e) for lg, n in sorted(ledgers.items()) for e in range(n) if start <= (lg, e) <= end
    ]
    for size in (1, 3, 10, 1000):
        cuts = split(start, end, size)
        assert covered(cuts, ledgers) == every  # in order, no gaps, no overlaps
        assert all(a <= b for a, b in cuts)
    cuts = split((1, 0), (1, 99), 10)
    assert len(cuts) == 10 and cuts[3] == ((1, 30), (1, 39))
    assert split((1, 0), (3, 4), 100) == [
        ((1, 0), (1, LAST_ENTRY)),
        ((2, 0), (2, LAST_ENTRY)),
        ((3, 0), (3, 4)),
    ]
    assert split((1, 5), (1, 4), 10) == []
    with pytest.raises(ValueError, match="rangeEntries must be positive"):
        split((1, 0), (1, 4), 0)


def test_columns_option_names_the_choices() -> None:
    assert column_names("value, segment") == ("segment", "value")
    with pytest.raises(ValueError, match=r"choose among topic, segment.*\(not nope\)"):
        column_names("segment,nope")


def test_offsets_follow_a_split_and_a_merge() -> None:
    start = StreamOffset(str(TOPIC), {})
    # segments 0 and 1; 0 split into 2 and 3 (0 sealed at 1:9), 2's broker slow to answer
    views = [
        SegmentView(0, (), (1, 9), sealed=False),
        SegmentView(1, (), (1, 4), sealed=False),
        SegmentView(2, (0,), (1, 2), sealed=False),
        SegmentView(3, (0,), None, sealed=False),
    ]
    first = advance(start, views)
    assert first.segments == {0: SegmentOffset((1, 10)), 1: SegmentOffset((1, 5))}
    assert advance(first, views) == first  # nothing new: the same offset, no micro-batch

    views[0] = SegmentView(0, (), (1, 11), sealed=True)
    views[2] = SegmentView(2, (0,), (1, 2), sealed=False, known=False)
    second = advance(first, views)
    assert second.get(0) == SegmentOffset((1, 12), done=True)  # its tail, and finished
    assert 2 not in second.segments  # its broker did not answer: left for the next one
    assert second.get(3) == SegmentOffset((1, 0))  # holds nothing yet
    parts = ranges(TOPIC, first, second, 100)
    assert [(r.segment, r.start, r.end) for r in parts] == [(0, "1:10", "1:11")]
    assert parts[0].topic == "segment://t/ns/orders/0" and parts[0].read_as == str(TOPIC)

    # 3 and 1 merge into 4: 4 waits until both are read to their end
    views[2] = SegmentView(2, (0,), (1, 2), sealed=False)
    views[3] = SegmentView(3, (0,), (1, 6), sealed=True)
    views.append(SegmentView(4, (3, 1), (1, 3), sealed=False))
    third = advance(second, views)
    assert third.get(2).next == (1, 3) and third.get(3) == SegmentOffset((1, 7), done=True)
    assert 4 not in third.segments  # 1 is not sealed yet
    views[1] = SegmentView(1, (), (2, 0), sealed=True)  # sealed after a restart: ledger 2
    fourth = advance(third, views)
    assert fourth.get(1) == SegmentOffset((2, 1), done=True) and fourth.get(4).next == (1, 4)
    parts = ranges(TOPIC, third, fourth, 100)
    assert [(r.segment, r.start, r.end) for r in parts] == [
        (1, "1:5", f"1:{LAST_ENTRY}"),
        (1, "2:0", "2:0"),
        (4, "1:0", "1:3"),
    ]

    restored = StreamOffset.from_json(json.loads(json.dumps(fourth.to_json())), TOPIC)
    assert restored == fourth
    assert list(fourth.to_json()["segments"]) == ["0", "1", "2", "3", "4"]


def test_start_at_latest_and_foreign_offsets() -> None:
    views = [SegmentView(0, (), (1, 9), sealed=True), SegmentView(1, (), None, sealed=False)]
    latest = at_latest(TOPIC, views)
    assert latest.segments == {0: SegmentOffset((1, 10), done=True), 1: SegmentOffset((1, 0))}
    assert advance(latest, views) == latest
    other = TopicName.parse("topic://t/ns/other")
    with pytest.raises(ValueError, match="not one of topic://t/ns/other"):
        StreamOffset.from_json(latest.to_json(), other)
    with pytest.raises(ValueError, match="offset of segment 0"):
        StreamOffset.from_json({"topic": str(TOPIC), "segments": {"0": {"next": "x"}}}, TOPIC)
