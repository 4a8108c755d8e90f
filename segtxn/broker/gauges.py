"""The broker's gauges: what it serves, read when ``/metrics`` is scraped."""

from __future__ import annotations

from typing import TYPE_CHECKING

from segtxn.broker.txn.markers import MarkerTransactionBuffer
from segtxn.broker.txn.pending_ack_log import MLPendingAckStore
from segtxn.protocol.names import Domain

if TYPE_CHECKING:
    from segtxn.broker.service import BrokerService


def register(service: BrokerService) -> None:
    """Register the gauges of ``service`` with its metrics."""
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
    metrics.gauge("segtxn_broker_topics", "Topics and segments loaded", lambda: len(service.topics))
    metrics.gauge(  # PIP-373
        "segtxn_broker_using_txn_topics_count",
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
        "segtxn_broker_backlog",
        "Unacknowledged messages over all subscriptions",
        lambda: sum(s.backlog() for t in service.topics.values() for s in t.subscriptions.values()),
    )


def _pending_ack_logs(service: BrokerService) -> list[MLPendingAckStore]:
    """The v4 pending-ack stores of the subscriptions loaded here."""
    return [
        s.pending_acks
        for t in service.topics.values()
        for s in t.subscriptions.values()
        if isinstance(s.pending_acks, MLPendingAckStore)
    ]
