"""The v4 coordinator's transaction log (PIP-31), kept bounded by compaction.

**Where it lives.** In the coordinator's data directory (a volume whoever takes an id over
must see), or, with ``--replication W/A``, replicated on the brokers' storage nodes like a
topic's ledgers (:func:`open_storage`): a successor anywhere reads it, and its recovery
fences the replicas, so a previous holder that is only paused can append nothing more.

**What it holds.** The holder of v4 coordinator id ``i`` owns the managed ledger
``__transaction_log_<i>``. Each entry is one transaction's whole state after a change (a
:class:`TxnMeta`): OPEN, new participants, COMMITTING / ABORTING / TIME_OUT, and
COMMITTED / ABORTED once the fan-out has succeeded. A transaction's latest entry is its
state.

**Who replays it.** The next holder of the id (:meth:`TxnLog.open`): every entry after the
log's ``compaction`` cursor, the latest per transaction winning. ``next_least`` is one past
the highest transaction number seen, and never below the ledger property
:data:`NEXT_LEAST`, so a number is never issued twice.

**Why it is compacted.** Without it the log grows by every transaction for ever and a
take-over replays all of it. PIP-31's coordinator trims its managed ledger; Kafka compacts
``__transaction_state``. The log is a :class:`~segtxn.ledger.compacted.CompactedLog`: once
``compact_entries`` entries were appended since the last compaction (and at least twice as
many as the transactions it keeps), :meth:`TxnLog.compact` cuts it, re-logs the state of
every transaction it keeps — not ended, or ended less than ``keep_ended_s`` ago, so a
repeated END_TXN still gets its answer — records :data:`NEXT_LEAST`, moves the cursor to
the cut, forgets the others and trims the ledgers before the cut.

**Why recovery stays correct.** Replaying from the cut gives what replaying the whole log
gives, minus the transactions that ended more than ``keep_ended_s`` before, and a crash at
any step of the compaction leaves a log that replays to the same live transactions
(:mod:`segtxn.ledger.compacted` says why). :data:`NEXT_LEAST` is recorded before the cursor
moves, so a transaction number is never reused, even once every transaction the log held
has been dropped from it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import aiohttp
import msgspec

from segtxn.ledger import LedgerSettings, LogStorage, Position, open_log_storage
from segtxn.ledger.compacted import CompactedLog, Compaction
from segtxn.ledger.errors import close_after_cut
from segtxn.ledger.replicas import ReplicatedLogStorage, Replication
from segtxn.metastore import MetadataStore
from segtxn.topics.catalog import Catalog
from segtxn.topics.nodes import CatalogNodes

OPEN, COMMITTING, ABORTING, TIME_OUT = "OPEN", "COMMITTING", "ABORTING", "TIME_OUT"
COMMITTED, ABORTED = "COMMITTED", "ABORTED"
FINAL = frozenset({COMMITTED, ABORTED})

NEXT_LEAST = "segtxn.v4.next_least"
"""Ledger property: no transaction number below it may be issued again."""


def open_storage(
    ledger_url: str,
    replication: Replication | None,
    catalog: Catalog,
    session: Callable[[], aiohttp.ClientSession] = aiohttp.ClientSession,
) -> tuple[LogStorage, CatalogNodes | None]:
    """Where the logs live: the files (or memory) of ``ledger_url``, which whoever may take
    an id over must reach; or, with ``replication``, the brokers' storage nodes (a
    coordinator has none of its own), so a coordinator anywhere can take any id over, and
    the files only serve the ledgers written before replication was turned on. The nodes
    are returned to be started and closed with the coordinator; ``session`` makes their
    HTTP session (the coordinator's cluster session when security is on)."""
    local = open_log_storage(ledger_url)
    if replication is None:
        return local, None
    nodes = CatalogNodes(catalog, replication.timeout_s, session=session)
    storage = ReplicatedLogStorage(
        nodes, local, write_quorum=replication.write_quorum, ack_quorum=replication.ack_quorum
    )
    return storage, nodes


def log_name(coordinator_id: int) -> str:
    return f"__transaction_log_{coordinator_id}"


class TxnMeta(msgspec.Struct, frozen=True):
    """One transaction as its log records it (each entry is its whole current state)."""

    txn: tuple[int, int]
    state: str
    timeout_ms: int
    created_ms: int
    partitions: list[str] = msgspec.field(default_factory=list)
    subscriptions: list[tuple[str, str]] = msgspec.field(default_factory=list)
    finalized_ms: int | None = None
    owner: str | None = None
    """The role that opened it (security on); None: opened with security off."""


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(TxnMeta).decode


class TxnLog:
    """One coordinator id's log and the transactions it holds (see the module docstring).
    Open with :meth:`open`; one owner at a time (the id's lease holder)."""

    def __init__(self, log: CompactedLog, *, compact_entries: int, keep_ended_s: float) -> None:
        self._log = log
        self.ledger = log.ledger
        self._compact_entries = compact_entries
        self._keep_ended_s = keep_ended_s
        self.txns: dict[int, TxnMeta] = {}
        """Every transaction the log holds, by ``least``: its latest durable state."""
        self.next_least = 0
        self.replayed = 0
        """Entries the open replayed."""

    @classmethod
    async def open(
        cls,
        name: str,
        store: MetadataStore,
        storage: LogStorage,
        settings: LedgerSettings,
        *,
        compact_entries: int,
        keep_ended_s: float,
    ) -> TxnLog:
        """Open the log and replay it (finishing any compaction a crash interrupted).

        Raises:
            LedgerError: the ledger cannot be opened or read (``LedgerFenced``: another
                holder took it over meanwhile).
            MetadataStoreError: the store failed.
        """
        log = await CompactedLog.open(name, store, storage, settings)
        txn_log = cls(log, compact_entries=compact_entries, keep_ended_s=keep_ended_s)
        try:
            txn_log.next_least = int(log.ledger.properties.get(NEXT_LEAST, "0"))
            async for entries in log.replay():
                for entry in entries:
                    txn_log._apply(_decode(entry.payload))
                txn_log.replayed += len(entries)
        except BaseException:  # failed or stopped mid-way: nothing else would close it
            await close_after_cut(log.close(), name)  # (raising what cut it, not this)
            raise
        return txn_log

    def _apply(self, meta: TxnMeta, _: Position | None = None) -> None:
        self.txns[meta.txn[1]] = meta
        self.next_least = max(self.next_least, meta.txn[1] + 1)

    # ------------------------------------------------------------------ appends

    def take_least(self) -> int:
        """A new transaction number (never one issued before, by this holder or any)."""
        least = self.next_least
        self.next_least += 1
        return least

    async def append(self, meta: TxnMeta) -> None:
        """Log a transaction's new state; once durable it is its state in ``txns`` (even
        if the caller stopped waiting meanwhile).

        Raises:
            LedgerError: the write failed; ``txns`` is unchanged.
        """
        await self._log.append(_encode(meta), lambda at: self._apply(meta, at))

    # ------------------------------------------------------------------ compaction

    @property
    def compacting(self) -> bool:
        return self._log.compacting

    @property
    def due(self) -> bool:
        """Whether the log has grown enough since its last compaction to compact it."""
        return self._log.due(self._compact_entries, len(self.txns))

    async def compact(self, *, now_ms: int | None = None) -> tuple[Compaction, int]:
        """Compact the log; returns what it did and how many ended transactions it dropped.

        Raises:
            LedgerError, MetadataStoreError: a step failed. What it leaves is recovered
                correctly; the next compaction starts over.
        """
        now = int(time.time() * 1000) if now_ms is None else now_ms
        horizon = now - self._keep_ended_s * 1000
        kept: list[TxnMeta] = []

        async def keep() -> Sequence[bytes]:
            kept[:] = [
                m
                for m in self.txns.values()
                if m.state not in FINAL or (m.finalized_ms or 0) >= horizon
            ]
            return [_encode(meta) for meta in kept]

        dropped: list[int] = []

        def forget(_: list[Position]) -> None:
            keeping = {m.txn[1] for m in kept}
            dropped[:] = [least for least in self.txns if least not in keeping]
            for least in dropped:
                del self.txns[least]

        done = await self._log.compact(
            keep, properties=lambda: {NEXT_LEAST: str(self.next_least)}, relogged=forget
        )
        return done, len(dropped)

    # ------------------------------------------------------------------ state

    @property
    def entries(self) -> int:
        """Entries a take-over would replay (those after the cursor)."""
        return self._log.entries

    @property
    def size_bytes(self) -> int:
        """Bytes of the ledgers the log retains."""
        return self._log.size_bytes

    async def close(self) -> None:
        await self._log.close()
