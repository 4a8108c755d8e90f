"""Coordinator settings: parsed once at start-up (CLI flags, Helm values) and passed in."""

from __future__ import annotations

from dataclasses import dataclass, field

from segtxn.auth import AuthSettings
from segtxn.connlimits import ConnectionLimits
from segtxn.ledger import LedgerSettings
from segtxn.ledger.replicas import RepairSettings, Replication
from segtxn.metastore import StoreCredentials


@dataclass(frozen=True)
class CoordinatorSettings:
    advertise_url: str
    store_url: str = "memory://"
    store_credentials: StoreCredentials = field(default_factory=StoreCredentials)
    """TLS and a user for the store connection (``--store-*``; none by default)."""
    coordinator_ids: int = 4
    """How many v5 coordinator ids exist (shared out among coordinator processes)."""
    session_ttl_s: float = 10.0
    store_timeout_s: float = 15.0
    """At start-up, how long to keep trying to reach the metadata store before giving up
    with ``StoreUnavailable`` (the process then exits saying so)."""
    default_timeout_s: float = 60.0
    max_timeout_s: float = 3600.0
    timeout_sweep_s: float = 1.0
    gc_sweep_s: float = 10.0
    gc_retention_s: float = 60.0
    """How long a final header stays after finalization before GC may delete it; v4: how
    long an ended transaction stays in its log (and answers a repeated END_TXN)."""
    abandon_after_s: float = 0.0
    """Force-delete op records left this long after finalization (0: never)."""
    id_block: int = 1000
    v4_coordinator_ids: int = 0
    """v4 (PIP-31) coordinator ids 0..N-1; 0: no v4 transactions here."""
    ledger_url: str = "memory://"
    """Where v4 transaction logs live without replication (a directory shared by whoever
    may take an id over), and where logs written before replication was turned on stay."""
    replication: Replication | None = None
    """Write v4 transaction logs to the brokers' storage nodes (brokers started with
    ``--replication``), so any coordinator process anywhere can take an id over."""
    repair: RepairSettings = field(default_factory=RepairSettings)
    """With ``replication``: how often the closed ledgers of the v4 logs held here are
    checked and repaired (the sweep settings are the brokers': a coordinator has no
    storage node)."""
    ledger: LedgerSettings = field(default_factory=LedgerSettings)
    v4_log_compact_entries: int = 10_000
    """Compact a v4 transaction log once this many entries were appended to it since its
    last compaction (and at least twice as many as the transactions it keeps): ended
    transactions older than ``gc_retention_s`` leave it and its older ledgers are deleted
    (segtxn/coordinator/txnlog.py). 0: never (the log grows for ever)."""
    fan_out_timeout_s: float = 10.0
    """How long a v4 END_TXN waits for unreachable (or moving: ``NotOwner``) participants
    before it answers ServiceNotReady (the decision is logged: the coordinator goes on
    with it in the background); also the limit of each of its background tries."""
    auth: AuthSettings = field(default_factory=AuthSettings)
    """Tokens, the policy and the cluster role's token (docs/security.md); off by default."""
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)
    """How many connections it holds at once, per address too, and how long an idle one
    stays open (:mod:`segtxn.connlimits`)."""
