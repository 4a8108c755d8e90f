"""The managed ledger's record in the metadata store, and the settings it is written with.

``/managed-ledgers/<quoted name>`` (:data:`METADATA_PREFIX`) holds the chain of ledgers
(closed ones with their entry counts and sizes), the next ledger id, the sealed flag and the
properties. It is written only with compare-and-set (:mod:`segtxn.ledger.fencing`). A
ledger is created on disk *before* the record names it, so every ledger the record names
has a file (a missing one means a lost or wrong data directory: ``LedgerMissing``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from urllib.parse import quote

import msgspec

from segtxn.ledger.logs import EntryLog, Placement
from segtxn.ledger.records import ENTRY_OVERHEAD, FORMAT

METADATA_PREFIX = "/managed-ledgers/"


@dataclass(frozen=True)
class LedgerSettings:
    max_ledger_bytes: int = 64 * 1024 * 1024
    """Roll over to a new ledger (file) once the current one is this large."""
    max_entry_bytes: int = 5 * 1024 * 1024
    max_batch_bytes: int = 4 * 1024 * 1024
    """Largest group-commit batch (one entry larger than this makes a batch of its own)."""
    max_batch_delay_s: float = 0.0
    """Extra time a batch may wait to fill; 0: write as soon as the previous sync ends."""
    max_pending_bytes: int = 64 * 1024 * 1024
    """Appends wait (backpressure) while this many bytes are queued and not yet durable."""
    max_persisted_ranges: int = 10_000
    """Individually acknowledged ranges a cursor stores (more are redelivered on restart)."""


def tail_bound(settings: LedgerSettings) -> int:
    """On-disk bytes one group-commit batch can span (batches count record headers)."""
    return max(settings.max_batch_bytes, settings.max_entry_bytes + ENTRY_OVERHEAD)


class LedgerInfo(msgspec.Struct, frozen=True):
    id: int
    created_ms: int
    entries: int | None = None
    """Entry count once closed; None for the ledger being appended to."""
    closed_ms: int | None = None
    """When it was closed: its last write (rollover, seal, clean close) or, after a crash,
    its recovery. None while open, and in records written before this was kept."""
    size_bytes: int | None = None
    """Its size on disk once closed (None: open, or recorded before this was kept)."""
    format: int = 0
    """Its file format (segtxn/ledger/records.py): 1 has a header and acknowledgement
    marks; 0 (ledgers created before) has entry records only."""
    replicas: tuple[str, ...] = ()
    """The storage nodes holding it (``"<broker id>@<instance>"``); empty: the owner's
    own storage (every ledger written before replication existed)."""
    ack_quorum: int = 0
    """How many of ``replicas`` held an entry before it was acknowledged."""
    nonce: int | None = None
    """The random nonce in its file's header (:mod:`segtxn.ledger.records`), recorded when
    it was created: a file under its name with another nonce is not this ledger's
    (``LedgerMismatch``). None: not kept (a replicated ledger, whose copies each have
    their own, a format-0 file, or a record written before this was kept)."""

    @property
    def placement(self) -> Placement:
        return Placement(self.replicas, self.ack_quorum)


def opened(entry_log: EntryLog, now_ms: int) -> LedgerInfo:
    """The metadata of a ledger just created: open, where its storage put it, and with
    the nonce that identifies its file."""
    return LedgerInfo(
        entry_log.ledger_id,
        now_ms,
        format=FORMAT,
        replicas=entry_log.placement.replicas,
        ack_quorum=entry_log.placement.ack_quorum,
        nonce=entry_log.nonce,
    )


def closed(info: LedgerInfo, entries: int, size_bytes: int, now_ms: int) -> LedgerInfo:
    """``info`` closed with ``entries``; a ledger closed already keeps its close time."""
    closed_ms = now_ms if info.closed_ms is None else info.closed_ms
    return msgspec.structs.replace(
        info, entries=entries, closed_ms=closed_ms, size_bytes=size_bytes
    )


def moved(
    meta: LedgerMetadata, ledger_id: int, was: Placement, now: Placement
) -> LedgerMetadata | None:
    """``meta`` with the closed ledger ``ledger_id`` kept on ``now``; None if it is not a
    closed ledger kept on ``was`` (trimmed, still open, or moved meanwhile)."""
    infos = [i for i in meta.ledgers if i.id == ledger_id]
    if not infos or infos[0].entries is None or infos[0].placement != was:
        return None
    kept = msgspec.structs.replace(infos[0], replicas=now.replicas, ack_quorum=now.ack_quorum)
    ledgers = [kept if i.id == ledger_id else i for i in meta.ledgers]
    return msgspec.structs.replace(meta, ledgers=ledgers)


class LedgerMetadata(msgspec.Struct, frozen=True):
    ledgers: list[LedgerInfo]
    next_ledger_id: int
    sealed: bool = False
    properties: dict[str, str] = msgspec.field(default_factory=dict)
    tail_bytes: int = 0
    """The most bytes one batch of the current writer can span on disk: how much of the
    last ledger's tail a crash may have left unacknowledged."""


encode = msgspec.json.Encoder().encode
decode = msgspec.json.Decoder(LedgerMetadata).decode


@functools.lru_cache(maxsize=4096)
def metadata_key(name: str) -> str:
    """The store key of ledger ``name``'s metadata record (remembered: every op-record
    step of a transaction checks the records of the ledgers it writes for)."""
    return METADATA_PREFIX + quote(name, safe="")
