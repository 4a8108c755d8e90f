"""A subscription's delivery counts (segtxn/broker/outstanding.py): each delivery counts,
an ack forgets, and pruning at the cursor's mark-delete position drops what it passed and
nothing after it. The counts are a plain dict in the order of first deliveries, not a
sorted one (a sorted map of positions cost 6 µs a message in the dispatcher's hot path);
these pin what that order must still give."""

from __future__ import annotations

from segtxn.broker.delivery import ConsumerLink
from segtxn.broker.outstanding import Outstanding
from segtxn.ledger import Position


def link() -> ConsumerLink:
    return ConsumerLink("c", lambda frame: None)


def test_each_delivery_counts_and_an_ack_forgets_the_count() -> None:
    outstanding, consumer = Outstanding(), link()
    assert outstanding.delivered(consumer, Position(1, 0)) == 0
    outstanding.due_again(Position(1, 0))
    assert outstanding.delivered(consumer, Position(1, 0)) == 1  # its redelivery_count
    outstanding.acked([Position(1, 0)])
    assert outstanding.deliveries == {}
    assert outstanding.delivered(consumer, Position(1, 0)) == 0


def test_pruning_drops_the_counts_up_to_the_mark_and_keeps_the_later_ones() -> None:
    outstanding, consumer = Outstanding(), link()
    positions = [Position(1, i) for i in range(5)] + [Position(2, i) for i in range(3)]
    for position in positions:
        outstanding.delivered(consumer, position)
    outstanding.due_again(Position(2, 1))
    outstanding.delivered(consumer, Position(2, 1))  # again: keeps its place, counts 2
    outstanding.prune_deliveries(Position(1, 4))  # across the ledger's end
    assert list(outstanding.deliveries) == [Position(2, 0), Position(2, 1), Position(2, 2)]
    assert outstanding.deliveries[Position(2, 1)] == 2
    outstanding.prune_deliveries(Position(2, 2))
    assert outstanding.deliveries == {}


def test_a_count_first_delivered_out_of_order_goes_once_the_mark_passes_the_one_before() -> None:
    outstanding, consumer = Outstanding(), link()
    for entry in (3, 1, 5):
        outstanding.delivered(consumer, Position(1, entry))
    outstanding.prune_deliveries(Position(1, 2))  # stops at 3: 1 waits behind it
    assert list(outstanding.deliveries) == [Position(1, 3), Position(1, 1), Position(1, 5)]
    outstanding.prune_deliveries(Position(1, 4))
    assert list(outstanding.deliveries) == [Position(1, 5)]
