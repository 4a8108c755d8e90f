"""Reopening a managed ledger: its chain of ledgers checked against the metadata store,
the last one recovered, and the next one created, in one compare-and-set.

Points 1 and 4 of the contract in :mod:`segtxn.ledger.recovery` (which holds the rules for
one file: points 2 and 3, and what a closed ledger is checked for when first read).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

import msgspec

from segtxn.ledger.cursor import cursors_prefix
from segtxn.ledger.errors import LedgerError, LedgerFenced, LedgerMissing
from segtxn.ledger.fencing import cas_put
from segtxn.ledger.identity import check_identities, delete_chain
from segtxn.ledger.logs import EntryLog, LogStorage, close_log_after_cut, open_in_thread
from segtxn.ledger.metadata import (
    LedgerMetadata,
    LedgerSettings,
    closed,
    decode,
    encode,
    metadata_key,
    opened,
    tail_bound,
)
from segtxn.ledger.position import Position
from segtxn.metastore import (
    MUST_NOT_EXIST,
    BadVersion,
    InvalidArgument,
    MetadataStore,
    NotFound,
    StoreAccessDenied,
    StoreFull,
)

log = logging.getLogger(__name__)


@dataclass
class Opened:
    """A managed ledger's state once recovered: what :class:`ManagedLedger` starts from."""

    metadata: LedgerMetadata
    version: int
    logs: dict[int, EntryLog]


async def open_chain(
    name: str, store: MetadataStore, storage: LogStorage, settings: LedgerSettings
) -> Opened:
    """Create the managed ledger ``name``, or recover it (points 1-4 above). Every file
    is checked to be its ledger's (the 24-byte headers: cheap) before anything is
    recovered or created, as :func:`check_files` does at start-up.

    Raises:
        LedgerMissing, LedgerCorrupted: as above (a WARNING names any truncation).
        LedgerMismatch: a file (any of them, not only the last) is another's: naming the
            first, how many there are, and which; nothing was changed.
        LedgerFenced: another owner created or changed it meanwhile.
    """
    key = metadata_key(name)
    record = await store.get(key)
    now_ms = int(time.time() * 1000)
    if record is None:
        first = await open_in_thread(storage.create, name, 1)
        meta = LedgerMetadata(
            [opened(first, now_ms)],
            next_ledger_id=2,
            tail_bytes=tail_bound(settings),
        )
        try:
            record = await store.put(key, encode(meta), expected_version=MUST_NOT_EXIST)
        except BaseException as e:
            await _let_go_of_first(name, storage, first, refused=isinstance(e, REFUSED))
            if isinstance(e, BadVersion):
                raise LedgerFenced(f"{name}: created concurrently by another owner") from e
            raise
        return Opened(meta, record.version, {1: first})
    meta = decode(record.value)
    await asyncio.to_thread(_check_files, name, storage, meta)
    # every file, not the last one only: a foreign older ledger found only when it is read
    # would let the topic load (and its broker be ready) and its readers stall on errors
    await asyncio.to_thread(check_identities, name, storage, meta.ledgers)
    last = meta.ledgers[-1]
    recovered = await open_in_thread(_recover_last, name, storage, meta, settings)
    logs: dict[int, EntryLog] = {last.id: recovered}
    try:
        size = recovered.size_bytes() if last.size_bytes is None else last.size_bytes
        kept = closed(last, recovered.count, size, now_ms)
        if recovered.placement != last.placement:  # its recovery made copies elsewhere
            kept = msgspec.structs.replace(
                kept,
                replicas=recovered.placement.replicas,
                ack_quorum=recovered.placement.ack_quorum,
            )
        ledgers = [*meta.ledgers[:-1], kept]
        next_id = meta.next_ledger_id
        if not meta.sealed:
            logs[next_id] = await open_in_thread(storage.create, name, next_id)
            ledgers.append(opened(logs[next_id], now_ms))
            next_id += 1
        meta = LedgerMetadata(
            ledgers,
            next_ledger_id=next_id,
            sealed=meta.sealed,
            properties=meta.properties,
            tail_bytes=tail_bound(settings),
        )
        version = await cas_put(store, key, encode(meta), record.version)
    except BaseException:  # failed or cancelled: what cut it is raised, not a close's failure
        for entry_log in logs.values():
            await close_log_after_cut(name, storage, entry_log)
        raise
    return Opened(meta, version, logs)


REFUSED = (BadVersion, StoreFull, StoreAccessDenied, InvalidArgument)
"""The store errors of a write it refused: the write was not applied, and never will be
(any other failure, ``StoreUnavailable`` or a cancel, leaves it unknown)."""


async def _let_go_of_first(
    name: str, storage: LogStorage, first: EntryLog, *, refused: bool
) -> None:
    """Close the first ledger's log after the record that was to name it failed. Removed
    when the store ``refused`` the record (:meth:`LogStorage.discard`, best effort): left,
    it outlived a managed ledger that never existed (no deletion knows of it, and its
    directory stayed). Kept when the write's outcome is unknown: it may still land,
    naming the log, and the next create reuses it, keeping its identity."""
    if not refused:
        await close_log_after_cut(name, storage, first)
        return
    try:
        await asyncio.to_thread(storage.discard, name, first)
    except (LedgerError, OSError) as e:  # (the failure to report is the create's)
        log.warning("%s: the first ledger of a refused create is left: %s", name, e)


async def check_files(name: str, store: MetadataStore, storage: LogStorage) -> None:
    """Check, without opening anything, that every ledger the metadata of ``name`` names
    has its file (point 1 above), and that each file is that ledger's (the nonce its
    ``LedgerInfo`` recorded): a broker checks its data directory at start-up this way, so
    that a wrong volume (another cluster's, an old copy) is refused before anything is
    served from it, not one ledger at a time as each is read.

    Raises:
        LedgerMissing: naming the missing files.
        LedgerMismatch: naming the first foreign file (and its ledger, and both nonces),
            and how many there are.
    """
    record = await store.get(metadata_key(name))
    if record is not None:
        meta = decode(record.value)
        await asyncio.to_thread(_check_files, name, storage, meta)
        await asyncio.to_thread(check_identities, name, storage, meta.ledgers)


async def check_deletable(name: str, store: MetadataStore, storage: LogStorage) -> None:
    """Check, opening and changing nothing, that deleting the managed ledger ``name`` (not
    open here) would not be refused for a file that is not its own: what
    :meth:`ManagedLedger.check_deletable` checks of an open one. Missing files and a ledger
    with no metadata pass (deleting them deletes nothing).

    Raises:
        LedgerMismatch: as :func:`check_identities`.
    """
    record = await store.get(metadata_key(name))
    if record is not None:
        meta = decode(record.value)
        await asyncio.to_thread(check_identities, name, storage, meta.ledgers)


async def delete_unopened(name: str, store: MetadataStore, storage: LogStorage) -> None:
    """Delete the managed ledger ``name``, open nowhere, without opening it (its files may
    be gone in part: a delete cut short), as :meth:`ManagedLedger.delete` does: its logs,
    then its cursors, then its metadata record, last, so that a delete cut short again is
    found and finished by doing it again. Its logs include the file a create whose
    metadata change failed left at its next ledger id (:func:`delete_chain`). Nothing to
    do when it has no metadata record.

    Raises:
        LedgerMismatch: as :func:`check_identities`; nothing was deleted.
    """
    record = await store.get(metadata_key(name))
    if record is None:
        return
    meta = decode(record.value)
    await delete_chain(name, storage, meta.ledgers, meta.next_ledger_id)
    await store.delete_range(cursors_prefix(name))
    with contextlib.suppress(NotFound):
        await store.delete(metadata_key(name))


async def movable(name: str, store: MetadataStore) -> bool:
    """Whether any broker could open ``name``: every ledger it holds is replicated (or it
    has none yet), so none of them lives on one broker's disk alone."""
    record = await store.get(metadata_key(name))
    return record is None or all(i.replicas for i in decode(record.value).ledgers)


def _check_files(name: str, storage: LogStorage, meta: LedgerMetadata) -> None:
    # (a replicated ledger is on its replicas, not necessarily here: reading one finds out)
    missing = [i for i in meta.ledgers if not i.replicas and not storage.exists(name, i.id)]
    if not missing:
        return
    paths = tuple(storage.where(name, i.id) for i in missing)
    known = sum(i.entries or 0 for i in missing)
    held = f"; they hold at least {known} entries" if known else ""
    if len(missing) == len(meta.ledgers):
        what = (
            f"none of the {len(missing)} ledger file(s) the metadata store names is in the "
            f"data directory ({', '.join(paths)}{held}): it is not the volume that holds "
            "them, or it lost them"
        )
    else:
        what = (
            f"{len(missing)} of the {len(meta.ledgers)} ledger files the metadata store "
            f"names are not in the data directory ({', '.join(paths)}{held})"
        )
    raise LedgerMissing(
        f"{name}: {what}. Nothing is recreated empty: mount the right volume or restore the files",
        paths=paths,
    )


def _recover_last(
    name: str, storage: LogStorage, meta: LedgerMetadata, settings: LedgerSettings
) -> EntryLog:
    last = meta.ledgers[-1]
    if last.entries is not None:  # closed cleanly or sealed: it must be whole
        entry_log = storage.open(
            name,
            last.id,
            log_format=last.format,
            entries=last.entries,
            size_bytes=last.size_bytes,
            placement=last.placement,
            nonce=last.nonce,
        )
        if entry_log.damage is not None:
            entry_log.close()
            raise entry_log.damage
        if entry_log.alteration is not None:  # nothing lost: served, and said
            log.warning("%s: %s", name, entry_log.alteration)
        return entry_log
    recovered = storage.recover(
        name,
        last.id,
        log_format=last.format,
        tail_bytes=meta.tail_bytes or tail_bound(settings),
        placement=last.placement,
        nonce=last.nonce,
    )
    if recovered.truncation is not None:
        log.warning("%s: recovery %s", name, recovered.truncation)
    return recovered.log


def report_lost(name: str, meta: LedgerMetadata, marks: dict[str, Position]) -> int:
    """Log at ERROR each subscription whose mark-delete ``marks[subscription]`` lies past the
    end of the closed ledger it points into: it consumed entries that are no longer there,
    so they had been stored and acknowledged, and the ledger's file lost them (a cut the
    file alone takes for an interrupted write, above, or a disk that lost synced data).
    Nothing is refused: what is left is served, and those entries cannot be recovered
    here. Returns how many subscriptions said so."""
    ends = {info.id: info.entries for info in meta.ledgers if info.entries is not None}
    told = 0
    for subscription, mark in sorted(marks.items()):
        count = ends.get(mark.ledger_id)
        if count is None or mark.entry_id < count:
            continue
        told += 1
        log.error(
            "%s: subscription %r had acknowledged up to %s, but ledger %d holds entries "
            "0..%d: %d stored and acknowledged entries are gone from its file (a cut file "
            "or a disk that lost synced writes); restore the file from a copy if there is "
            "one, else they are lost",
            name,
            subscription,
            mark,
            mark.ledger_id,
            count - 1,
            mark.entry_id - count + 1,
        )
    return told
