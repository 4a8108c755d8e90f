"""Broker settings: parsed once at start-up (CLI flags, Helm values) and passed in."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from segtxn.auth import AuthSettings
from segtxn.broker.txn.headers import HeaderWatch
from segtxn.connlimits import ConnectionLimits
from segtxn.ledger import LedgerSettings, RetentionPolicy
from segtxn.ledger.replicas import RepairSettings, Replication
from segtxn.metastore import StoreCredentials
from segtxn.protocol.limits import DEFAULT_MAX_MESSAGE_BYTES, MAX_BROKER_ID

BROKER_ID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{MAX_BROKER_ID - 1}}}")
"""A broker id names files (its snapshot logs): MAX_BROKER_ID keeps them under 255 bytes."""

UNORDERED_REDELIVERY = "unordered-redelivery"
"""Test-only bug: ordered subscriptions hand messages back one by one instead of rewinding
(the race issue 14 fixed), so the soak harness can show it catches it."""
TEST_BUGS = frozenset({UNORDERED_REDELIVERY})


@dataclass(frozen=True)
class V4TxnSettings:
    """How a broker checks the v4 transactions clients name (segtxn/broker/txn/v4checks.py)."""

    check_timeout_s: float = 5.0
    """How long a send or ack naming a v4 transaction not yet seen on its topic waits for
    the transaction's coordinator to confirm it; then it is refused (ServiceNotReady)."""
    grace_s: float = 30.0
    """How long past a v4 transaction's timeout the broker waits for its coordinator's
    decision before ending it itself: with the coordinator's decision if one answers, else
    aborted (an abort marker). Covers clock skew and a coordinator's take-over."""
    max_timeout_s: float = 3600.0
    """The timeout assumed for a v4 transaction found open in a topic at recovery whose
    coordinator does not answer (the longest a coordinator grants by default)."""
    sweep_s: float = 5.0
    """How often the broker looks for v4 transactions past their timeout and grace."""

    def __post_init__(self) -> None:
        if (
            min(self.check_timeout_s, self.sweep_s) <= 0
            or min(self.grace_s, self.max_timeout_s) < 0
        ):
            raise ValueError("v4 transaction check timeouts must be positive")


@dataclass(frozen=True)
class BrokerSettings:
    broker_id: str
    """Stable identity: a broker's topics (without replication, on its disk alone) come back
    with this id."""
    advertise_url: str
    """How clients and other brokers reach this broker (http://host:port)."""
    store_url: str = "memory://"
    store_credentials: StoreCredentials = field(default_factory=StoreCredentials)
    """TLS and a user for the store connection (``--store-*``; none by default)."""
    ledger_url: str = "memory://"
    """Where managed ledgers live: file:///dir (or a path) or memory://."""
    replication: Replication | None = None
    """Replicate new ledgers across brokers (needs a ``file://`` ledger URL; each broker
    then also keeps replicas, under ``<dir>/.replicas``). None: each ledger lives on its
    owner's disk only, and its topic cannot move."""
    repair: RepairSettings = field(default_factory=RepairSettings)
    """With ``replication``: how often the closed ledgers served here are checked and
    repaired, and the storage node swept (:mod:`segtxn.broker.replication`)."""
    session_ttl_s: float = 10.0
    store_timeout_s: float = 15.0
    """At start-up, how long to keep trying to reach the metadata store before giving up
    with ``StoreUnavailable`` (the process then exits saying so)."""
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    """Largest payload accepted (the entry also carries the message's metadata)."""
    max_pending_sends: int = 1000
    """Sends one producer may have in flight; further frames wait (backpressure)."""
    max_publish_buffer_bytes: int = 256 * 1024 * 1024
    """Payload bytes of sends read from all producer connections and not yet answered
    (``--publish-buffer-size``); past it the broker stops reading producers' sockets until
    sends in flight are answered (segtxn/broker/publish_budget.py). At least
    ``max_message_bytes``. 256 MiB: four ledgers' full write queues
    (``LedgerSettings.max_pending_bytes``, 64 MiB each), fifty of the largest messages, or
    260 producers each with a full window of 1 KiB messages, so producers wait on it only
    when the disks fall behind or a client floods the broker; and a quarter of a broker
    with 1 GiB of memory, leaving the rest for what else a send holds on its way to disk
    (its frame, its entry) and the caches. (Pulsar's default: half the direct memory.)"""
    max_permits: int = 10_000
    """Largest flow grant a consumer may hold."""
    dispatch_batch: int = 100
    auto_create_topics: bool = False
    dedup_snapshot_every: int = 1000
    """Persist de-duplication state after this many messages on a topic."""
    dedup_expiry_s: float = 24 * 3600.0
    """Forget a producer name that stored nothing for this long and is not connected
    (segtxn/broker/dedup.py): a resend older than this is stored again."""
    ledger: LedgerSettings = field(default_factory=LedgerSettings)
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    """Broker-wide, for every topic and segment served here: 7 days and no size limit by
    default; unconsumed data is never deleted (the rules: :mod:`segtxn.ledger.retention`)."""
    retention_check_s: float = 60.0
    """How often ledgers past retention are trimmed (with their indexes), and idle topics
    unloaded (``unload_idle_s``)."""
    unload_idle_s: float = 600.0
    """A sealed topic or segment with no client and no transaction in flight is unloaded
    once it has been idle this long (0: never): a broker serving a topic that splits and
    merges for months would otherwise keep every sealed segment open (memory, files)."""
    retire_check_s: float = 600.0
    """How often the sealed segments homed here are checked for retirement (their data,
    records and DAG node deleted once consumed and past retention: segtxn/broker/retire.py;
    0: never)."""
    txn_buffer_snapshot_every: int = 100
    """A persistent topic's v4 transaction buffer snapshots its indexes after this many
    markers (recovery replays the ledger from the latest snapshot)."""
    txn_log_compact_entries: int = 1000
    """Compact a namespace's v4 snapshot log, or a subscription's v4 pending-ack log, once
    this many entries were appended to it since its last compaction (and twice as many as
    it keeps): only each topic's latest snapshot, and the acks of open transactions, are
    kept (segtxn/ledger/compacted.py). 0: never (the logs grow for ever)."""
    v4_txns: V4TxnSettings = field(default_factory=V4TxnSettings)
    """Checking the v4 transactions sends and acks name, and ending abandoned ones."""
    controller_sweep_s: float = 5.0
    """How often a broker looks for splits or merges a dead controller left unfinished."""
    header_watch: HeaderWatch = HeaderWatch.PREFIX
    """How the broker follows transaction headers (``--header-watch``): ``prefix``, one
    watch on every header of the cluster (a transaction's first send needs no header read);
    ``scoped``, one point watch per transaction its segments touch, all on one stream (its
    watch work follows its own load). See docs/transactions.md."""
    consumer_hold_s: float = 10.0
    """A Failover member of a segment's subscription whose connection drops (not a clean
    close) keeps its place this long: its segments wait for it to come back under the same
    name rather than move to another member. 0: they move at once."""

    auth: AuthSettings = field(default_factory=AuthSettings)
    """Tokens, the policy and the cluster role's token (docs/security.md); off by default."""
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)
    """How many connections it holds at once, per address too, and how long an idle one
    stays open (:mod:`segtxn.connlimits`)."""

    test_bugs: frozenset[str] = frozenset()
    """Known bugs put back on purpose to prove the soak harness catches them (tests only,
    never in production; ``segtxn`` reads them from ``SEGTXN_TEST_BUGS``): see
    :data:`TEST_BUGS`."""

    def __post_init__(self) -> None:
        unknown = self.test_bugs - TEST_BUGS
        if unknown:
            raise ValueError(
                f"unknown test bug(s) {', '.join(sorted(unknown))}: known are "
                + ", ".join(sorted(TEST_BUGS))
            )
        if not BROKER_ID.fullmatch(self.broker_id):
            raise ValueError(f"broker id {self.broker_id!r}: 1-63 of letters, digits, _.-")
        if not self.advertise_url.startswith(("http://", "https://")):
            raise ValueError(f"advertise URL {self.advertise_url!r} must be http(s)://host:port")
        if self.replication is not None and not self.ledger_url.startswith("file://"):
            raise ValueError("replication needs ledgers in files (a file:// ledger URL)")
        limit = self.ledger.max_entry_bytes - 64 * 1024
        if self.max_message_bytes > limit:
            raise ValueError(f"max_message_bytes must leave room for metadata (<= {limit})")
        if self.max_publish_buffer_bytes < self.max_message_bytes:
            raise ValueError(
                f"the publish buffer (max_publish_buffer_bytes, --publish-buffer-size: "
                f"{self.max_publish_buffer_bytes} bytes) must hold the largest message "
                f"(max_message_bytes: {self.max_message_bytes})"
            )
