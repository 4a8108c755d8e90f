"""The coordinator's metrics, in the shape every segtxn server exports
(:mod:`segtxn.exposition`): its counters (PIP-471's names, segtxn prefix), the GC backlog,
the ids it holds, its v4 transaction logs, and how long END_TXN takes.
docs/metrics.md lists every family."""

from __future__ import annotations

from collections.abc import Iterator

from segtxn.coordinator.v4 import CoordinatorV4
from segtxn.coordinator.v5 import CoordinatorV5
from segtxn.exposition import Family, Metrics, counter_family, gauge_family

V5_COUNTERS = (
    ("opened", "Transactions created (NEW_TXN)"),
    ("committed", "Transactions committed"),
    ("aborted", "Transactions aborted (including timeouts)"),
    ("timeouts", "Transactions aborted by the timeout sweep"),
    ("gc_headers", "Headers deleted by the GC sweep"),
    ("gc_forced_ops", "Op records force-deleted as abandoned"),
)
V4_COUNTERS = (
    ("log_compaction_failures", "v4 transaction log compactions that failed"),
    ("log_trimmed_ledgers", "v4 transaction log ledgers deleted by compactions"),
    ("log_trimmed_entries", "v4 transaction log entries deleted by compactions"),
    ("log_dropped_txns", "Ended v4 transactions dropped from their log"),
)


class CoordinatorMetrics(Metrics):
    def __init__(self, v5: CoordinatorV5, v4: CoordinatorV4) -> None:
        super().__init__("coordinator")
        self.end_txn = self.labelled_histogram(
            "segtxn_txn_end_duration_seconds",
            "END_TXN answered successfully: request received to the decision durable (v5: "
            "the header CAS; v4: the log entry and the participants told), by action and "
            "protocol",
            ["action", "protocol"],
        )
        self.add_collector(_V5(v5))
        self.add_collector(_V4(v4))


class _V5:
    def __init__(self, coordinator: CoordinatorV5) -> None:
        self._c = coordinator

    def collect(self) -> Iterator[Family]:
        counters = self._c.counters
        yield counter_family(
            "segtxn_txn_metadata_store_header_cas_total",
            "Header CAS attempts, by result",
            ["result"],
            [([r], counters[f"header_cas_{r}"]) for r in ("ok", "conflict", "reject")],
        )
        for name, text in V5_COUNTERS:
            yield counter_family(f"segtxn_txn_{name}_total", text, [], [([], counters[name])])
        yield gauge_family(
            "segtxn_txn_metadata_store_outstanding_op_records",
            "Op records of finalized transactions awaiting participant clean-up (GC backlog)",
            [],
            [([], self._c.gc_backlog)],
        )
        yield gauge_family(
            "segtxn_txn_coordinator_ids_held",
            "v5 coordinator ids held by this process",
            [],
            [([], len(self._c.held))],
        )


class _V4:
    """The v4 coordinator's transaction logs: how big each one held here is, and what
    compaction has done (segtxn/coordinator/txnlog.py). Series per id exist while it is
    held here."""

    def __init__(self, coordinator: CoordinatorV4) -> None:
        self._c = coordinator

    def collect(self) -> Iterator[Family]:
        counters = self._c.counters
        yield counter_family(  # the brokers count their v4 logs' under the same name
            "segtxn_txn_v4_log_compactions_total",
            "Compactions of v4 logs, by log (transaction: a coordinator id's transaction log)",
            ["log"],
            [(["transaction"], counters["log_compactions"])],
        )
        for name, text in V4_COUNTERS:
            yield counter_family(f"segtxn_txn_v4_{name}_total", text, [], [([], counters[name])])
        if self._c.repairer is not None:
            yield gauge_family(
                "segtxn_txn_v4_log_under_replicated_ledgers",
                "Closed ledgers of the v4 transaction logs held here with fewer live copies "
                "than the write quorum, or a copy found behind, at the last repair check",
                [],
                [([], self._c.repairer.under_replicated)],
            )
        held = sorted(self._c.held.items())
        yield gauge_family(
            "segtxn_txn_v4_log_entries",
            "Entries a take-over of the id would replay",
            ["coordinator"],
            [([str(i)], h.log.entries) for i, h in held],
        )
        yield gauge_family(
            "segtxn_txn_v4_log_bytes",
            "Bytes of the ledgers the log retains",
            ["coordinator"],
            [([str(i)], h.log.size_bytes) for i, h in held],
        )
        yield gauge_family(
            "segtxn_txn_v4_log_txns",
            "Transactions the log holds (live and recently ended)",
            ["coordinator"],
            [([str(i)], len(h.txns)) for i, h in held],
        )
