"""Broker metrics: the broker-wide families, exported for Prometheus at ``/metrics``.

Each broker has its own :class:`BrokerMetrics` (several brokers may share a process in
tests and in ``segtxn standalone``). What is counted per message is a plain integer
addition (:mod:`segtxn.exposition`); the per-topic and per-subscription families are read
off the loaded topics when ``/metrics`` is scraped (:mod:`segtxn.broker.gauges`), so a topic
that is unloaded takes its series with it. docs/metrics.md lists every family.
"""

from __future__ import annotations

from segtxn.exposition import Metrics


class BrokerMetrics(Metrics):
    def __init__(self) -> None:
        super().__init__("broker")
        # Counted by the connections (segtxn/broker/ws.py, producer_endpoint.py): they
        # outlive topic unloads.
        self.messages_in = self.count(
            "segtxn_broker_in_messages_total", "Messages stored (duplicates not included)"
        )
        self.bytes_in = self.count("segtxn_broker_in_bytes_total", "Payload bytes stored")
        self.messages_out = self.count(
            "segtxn_broker_out_messages_total", "Messages delivered to consumers"
        )
        self.bytes_out = self.count(
            "segtxn_broker_out_bytes_total", "Payload bytes delivered to consumers"
        )
        self.duplicates = self.count(
            "segtxn_broker_duplicates_dropped_total", "Resent messages dropped as duplicates"
        )
        self.errors = self.labelled_count(
            "segtxn_broker_errors_total", "Errors returned to producers, by name", ["error"]
        )
        self.publish_buffer_waits = self.count(
            "segtxn_broker_publish_buffer_waits_total",
            "Times a producer connection stopped reading to wait for room in the publish buffer",
        )
        self.publish_latency = self.histogram(
            "segtxn_broker_publish_latency_seconds", "Send received to durable receipt"
        )
        self.topology_changes = self.labelled_count(
            "segtxn_topic_changes_total",
            "Splits and merges this broker completed as a topic controller, by kind",
            ["kind"],
        )
        self.segments_retired = self.count(
            "segtxn_segments_retired_total",
            "Sealed segments homed here that were retired: consumed, past retention, deleted "
            "and pruned from their topic's DAG",
        )
        self.topology_change_seconds = self.histogram(
            "segtxn_topic_change_seconds",
            "Split/merge duration: plan, place, prepare, seal, complete",
        )
        # PIP-471's metrics, with segtxn's prefix
        self.txn_op_writes = self.labelled_count(
            "segtxn_txn_metadata_store_op_writes_total",
            "Op-record writes (a record is rewritten as its transaction grows), by kind",
            ["kind"],
        )
        self.txn_one_step_commits = self.labelled_count(
            "segtxn_txn_one_step_commits_total",
            "Commits clients asked of this broker (all of a transaction's operations here), by "
            "answer: committed in an op-record step, or not_here (ended at its coordinator); "
            "and by how they came: a frame on a producer connection, or a request",
            ["answer", "via"],
        )
        self.txn_materialized = self.labelled_count(
            "segtxn_txn_materialized_total",
            "Transaction outcomes applied by participants, by outcome and part",
            ["outcome", "part"],
        )
        self.txn_commit_to_visible = self.histogram(
            "segtxn_txn_commit_to_visible_seconds",
            "v5: from the coordinator's commit to its entries being readable on a segment "
            "here (wall clocks of two processes)",
        )
        self.txn_header_events = self.count(
            "segtxn_txn_header_events_total",
            "Transaction header changes this broker's header watch delivered (prefix mode: "
            "every header of the cluster; scoped: those of transactions its segments touch)",
        )
        self.txn_index_query = self.histogram(
            "segtxn_txn_metadata_store_index_query_seconds",
            "Range queries of writes-by-segment / acks-by-segment-sub",
        )
        self.txn_v4_checks = self.labelled_count(
            "segtxn_txn_v4_checks_total",
            "v4 transactions checked with their coordinator before a first send or ack on a "
            "topic, by result (admitted, not_found, status, unavailable, busy)",
            ["result"],
        )
        self.txn_v4_ended_here = self.labelled_count(
            "segtxn_txn_v4_ended_by_broker_total",
            "v4 transactions past their timeout and grace that a broker ended itself on a "
            "topic or subscription, by outcome and why",
            ["outcome", "why"],
        )
        self.txn_v4_log_compactions = self.labelled_count(
            "segtxn_txn_v4_log_compactions_total",
            "Compactions of this broker's v4 logs, by log (snapshot: a namespace's "
            "transaction-buffer snapshots; pending_ack: a subscription's pending acks)",
            ["log"],
        )
