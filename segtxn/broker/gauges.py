"""The broker's gauges and per-topic families: read off what it serves when ``/metrics`` is
scraped, never counted per message here.

Per-topic series carry ``topic`` (the full name: a ``persistent://`` topic or one
``segment://`` of a scalable topic), per-subscription ones also ``subscription``. They exist
while the topic is loaded on this broker: an unloaded topic's series disappear with it, so
the number of series follows what the broker serves now. Counters of a topic start again
from zero when it is loaded again (Prometheus's ``rate()`` takes that as a reset).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from segtxn.broker.txn.markers import MarkerTransactionBuffer
from segtxn.broker.txn.pending_ack_log import MLPendingAckStore
from segtxn.exposition import Family, counter_family, gauge_family
from segtxn.protocol.names import Domain

if TYPE_CHECKING:
    from segtxn.broker.dispatch import Subscription
    from segtxn.broker.service import BrokerService
    from segtxn.broker.topic import Topic

TOPIC = ("topic",)
SUBSCRIPTION = ("topic", "subscription")


def register(service: BrokerService) -> None:
    """Register the gauges of ``service`` and its per-topic collector with its metrics."""
    metrics = service.metrics
    metrics.gauge(
        "segtxn_broker_active_segments",
        "Segments served here that are not sealed",
        lambda: sum(
            1
            for t in service.topics.values()
            if t.name.domain is Domain.SEGMENT and not t.ledger.is_sealed
        ),
    )
    metrics.gauge(  # PIP-373's using_txn_topics_count, without a histogram's _count suffix
        "segtxn_broker_topics_with_txns",
        "Loaded persistent topics that contain transactional messages",
        lambda: sum(
            1
            for t in service.topics.values()
            if isinstance(t.buffer, MarkerTransactionBuffer) and t.buffer.contains_txn
        ),
    )
    metrics.gauge(
        "segtxn_txn_v4_snapshot_log_entries",
        "Entries in this broker's open v4 snapshot logs (what reopening them replays)",
        lambda: sum(log_.entries for log_ in service.snapshots.opened()),
    )
    metrics.gauge(
        "segtxn_txn_v4_snapshot_log_bytes",
        "Bytes of this broker's open v4 snapshot logs",
        lambda: sum(log_.size_bytes for log_ in service.snapshots.opened()),
    )
    metrics.gauge(
        "segtxn_txn_v4_pending_ack_log_entries",
        "Entries in the v4 pending-ack logs of the subscriptions loaded here",
        lambda: sum(p.log_entries for p in _pending_ack_logs(service)),
    )
    metrics.gauge(
        "segtxn_txn_v4_pending_ack_log_bytes",
        "Bytes of the v4 pending-ack logs of the subscriptions loaded here",
        lambda: sum(p.log_bytes for p in _pending_ack_logs(service)),
    )
    metrics.gauge(
        "segtxn_txn_metadata_store_op_steps_in_flight",
        "Op-record steps sent to the metadata store and not yet answered",
        lambda: service.op_records.steps_in_flight,
    )
    metrics.gauge(
        "segtxn_txn_header_point_watches",
        "Scoped header watch: transaction headers watched now, one per transaction a "
        "segment here listens to (0 in prefix mode)",
        lambda: service.headers.point_watches,
    )
    metrics.gauge(
        "segtxn_broker_producers",
        "Connected producers",
        lambda: sum(len(t.producers) for t in service.topics.values()),
    )
    metrics.gauge(
        "segtxn_broker_consumers",
        "Connected consumers",
        lambda: sum(
            len(s.consumers) for t in service.topics.values() for s in t.subscriptions.values()
        ),
    )
    metrics.gauge(
        "segtxn_broker_backlog_messages",
        "Unacknowledged messages over all subscriptions",
        lambda: sum(s.backlog() for t in service.topics.values() for s in t.subscriptions.values()),
    )
    budget = service.publish_budget
    metrics.gauge(
        "segtxn_broker_publish_buffer_bytes",
        "Payload bytes of sends read from producers and not yet answered",
        lambda: budget.in_use,
    )
    metrics.gauge(
        "segtxn_broker_publish_buffer_limit_bytes",
        "The publish buffer's limit (--publish-buffer-size)",
        lambda: budget.limit,
    )
    metrics.gauge(
        "segtxn_broker_publish_buffer_waiting_connections",
        "Producer connections waiting for room in the publish buffer (not reading)",
        lambda: budget.waiting,
    )
    metrics.add_collector(_Topics(service))


def _pending_ack_logs(service: BrokerService) -> list[MLPendingAckStore]:
    """The v4 pending-ack stores of the subscriptions loaded here."""
    return [
        s.pending_acks
        for t in service.topics.values()
        for s in t.subscriptions.values()
        if isinstance(s.pending_acks, MLPendingAckStore)
    ]


def pinned_entries(topic: Topic) -> int:
    """Entries stored but not readable yet: behind an open transaction's first entry (or an
    append in flight). Readers of every subscription wait for these."""
    horizon = topic.buffer.max_read_position
    return 0 if horizon is None else topic.ledger.count_after(horizon)


class _Topics:
    """The per-topic and per-subscription families of the topics loaded now."""

    def __init__(self, service: BrokerService) -> None:
        self._service = service

    def collect(self) -> Iterator[Family]:
        named = sorted(((str(t.name), t) for t in self._service.topics.values()), key=_first)
        topics = [t for _, t in named]
        yield gauge_family(
            "segtxn_broker_topics",
            "Topics loaded here, by domain (persistent: topics, segment: segments)",
            ["domain"],
            [([d.value], sum(1 for t in topics if t.name.domain is d)) for d in _SERVED],
        )
        per_topic: list[tuple[str, str, Callable[[Topic], float]]] = [
            ("in_messages_total", "Messages stored", lambda t: t.counters.messages_in),
            ("in_bytes_total", "Payload bytes stored", lambda t: t.counters.bytes_in),
            (
                "out_messages_total",
                "Messages delivered to consumers",
                lambda t: sum(s.messages_out for s in t.subscriptions.values()),
            ),
            (
                "out_bytes_total",
                "Payload bytes delivered to consumers",
                lambda t: sum(s.bytes_out for s in t.subscriptions.values()),
            ),
            (
                "duplicates_dropped_total",
                "Resent messages dropped as duplicates",
                lambda t: t.counters.duplicates,
            ),
            ("producers", "Connected producers", lambda t: len(t.producers)),
            ("subscriptions", "Subscriptions", lambda t: len(t.subscription_names())),
            (
                "backlog_messages",
                "Unacknowledged messages over its subscriptions",
                lambda t: sum(s.backlog() for s in t.subscriptions.values()),
            ),
            (
                "txn_pinned_entries",
                "Entries stored but not yet readable: behind the first entry of the oldest "
                "open transaction (or an append in flight)",
                pinned_entries,
            ),
        ]
        for suffix, help_, read in per_topic:
            samples = [((name,), float(read(t))) for name, t in named]
            name = f"segtxn_topic_{suffix}"
            if suffix.endswith("_total"):
                yield counter_family(name, help_, TOPIC, samples)
            else:
                yield gauge_family(name, help_, TOPIC, samples)
        ages = [((name,), t.buffer.oldest_open_age_s()) for name, t in named]
        yield gauge_family(
            "segtxn_topic_txn_oldest_open_age_seconds",
            "How long the oldest transaction with entries here has been open (no sample: "
            "none is open)",
            TOPIC,
            [(labels, age) for labels, age in ages if age is not None],
        )
        yield from self._subscriptions(named)

    def _subscriptions(self, named: list[tuple[str, Topic]]) -> Iterator[Family]:
        subs = [
            ((topic, name), s) for topic, t in named for name, s in sorted(t.subscriptions.items())
        ]
        per_subscription: list[tuple[str, str, Callable[[Subscription], float]]] = [
            ("backlog_messages", "Messages not acknowledged yet", lambda s: s.backlog()),
            (
                "unacked_messages",
                "Messages delivered to a consumer and not acknowledged yet",
                lambda s: s.unacked,
            ),
            (
                "txn_pending_acks",
                "Acks held by open transactions (one per individual ack, one per "
                "transaction holding a cumulative ack)",
                lambda s: s.pending_acks.pending_count(),
            ),
            ("consumers", "Connected consumers", lambda s: len(s.consumers)),
            ("out_messages_total", "Messages delivered", lambda s: s.messages_out),
            ("out_bytes_total", "Payload bytes delivered", lambda s: s.bytes_out),
        ]
        for suffix, help_, read in per_subscription:
            samples = [(labels, float(read(s))) for labels, s in subs]
            name = f"segtxn_subscription_{suffix}"
            if suffix.endswith("_total"):
                yield counter_family(name, help_, SUBSCRIPTION, samples)
            else:
                yield gauge_family(name, help_, SUBSCRIPTION, samples)


_SERVED = (Domain.PERSISTENT, Domain.SEGMENT)


def _first(pair: tuple[str, Topic]) -> str:
    return pair[0]
