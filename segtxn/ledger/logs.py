"""Entry logs: the physical ledgers a managed ledger is made of.

An :class:`EntryLog` is one append-only ledger: entries numbered 0, 1, 2, ... written in
batches that are durable when ``append_batch`` returns. :class:`LogStorage` creates, opens
and recovers them, and deletes them. A replicated implementation (BookKeeper-style
ensembles) would slot in here; the managed ledger above does not care where bytes live.

Methods are blocking: the managed ledger calls them from a worker thread (appends and reads
through ``append_batch_async`` and ``read_async``, which a log doing its I/O as coroutines
runs on the loop instead), one at a time per log (appends are serialized by the
group-commit writer; reads may run concurrently with an append and only ever see whole,
synced entries).

What a crash may leave behind, and what recovery does about it, is the contract of
:mod:`segtxn.ledger.recovery`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from segtxn.ledger.errors import LedgerCorrupted, LedgerMissing, close_after_cut

log = logging.getLogger(__name__)


class Placement(NamedTuple):
    """Where a ledger's entries are kept: on this broker (no replicas), or on each of
    ``replicas`` (``"<broker id>@<instance>"``), an entry durable once ``ack_quorum`` of
    them hold it (:mod:`segtxn.ledger.replicas`). Recorded in the ledger's
    ``LedgerInfo`` when it is created; it never changes."""

    replicas: tuple[str, ...] = ()
    ack_quorum: int = 0


LOCAL = Placement()
"""A ledger kept in this broker's own storage (a file, or memory)."""


def check_local(placement: Placement, where: str) -> None:
    """Raises LedgerMissing for a replicated ledger: storage that keeps ledgers on this
    broker alone cannot serve one."""
    if placement.replicas:
        raise LedgerMissing(
            f"{where}: the ledger is replicated (on {', '.join(placement.replicas)}), and "
            "this broker keeps ledgers in its own storage only: start it with replication",
            paths=(where,),
        )


@dataclass(frozen=True)
class Truncation:
    """What recovery cut off the end of a ledger: never-acknowledged bytes."""

    path: str
    start: int
    """The first byte removed (the file's new size)."""
    end: int
    """The file's size before."""
    first_entry: int
    """How many entries are kept: the id of the first entry removed, if any was."""
    reason: str

    def __str__(self) -> str:
        kept = f"entries 0..{self.first_entry - 1}" if self.first_entry else "no entry"
        return (
            f"truncated {self.path} at byte {self.start} (bytes {self.start}..{self.end}, "
            f"{self.end - self.start} bytes), keeping {kept}: {self.reason}"
        )


@dataclass(frozen=True)
class Alteration:
    """How a closed ledger's file changed after it closed, with every entry recorded then
    still in its place and passing its checksum: nothing is lost, so it is served as it
    is (and never changed), and the managed ledger logs this once, at WARNING."""

    path: str
    ledger_id: int
    entries: int
    """The entry count recorded when it closed: all of them are served, nothing after."""
    what: str
    """What was found, and where: its final acknowledgement mark missing, bytes after
    its end."""
    cause: str
    """What can have done it (the broker never writes to a closed ledger, but the final
    mark is never synced by itself: a power loss can take it)."""

    def __str__(self) -> str:
        return (
            f"{self.path} changed after ledger {self.ledger_id} closed: {self.what}; the "
            f"{self.entries} entries recorded when it closed are intact and are served as "
            f"they are (the file is left as it is). {self.cause}"
        )


class EntryLog(ABC):
    ledger_id: int
    placement: Placement = LOCAL
    """Where its entries are kept: recorded in the ledger's metadata when it is created."""
    wants_rollover: bool = False
    """Set when the log should take no more batches although it still could (a replica
    dropped out of a replicated one): the managed ledger starts its next ledger."""
    damage: LedgerCorrupted | None = None
    """Set when a closed ledger was opened damaged: entries from ``count`` on cannot be
    read, and reading them raises this error (the entries before it are served)."""
    alteration: Alteration | None = None
    """Set when a closed ledger was opened whole but changed since it closed (its final
    mark cut off, bytes after its end): every entry is served, nothing past them."""
    nonce: int | None = None
    """The identity of a log created (or recovered) for appending: the random nonce in its
    file's header, recorded in its ``LedgerInfo`` when it is created, so that a file of
    the same name that is not this ledger's is refused (``LedgerMismatch``). None: storage
    without one (memory; a replicated log, whose copies are named by their nodes'
    instances)."""
    reused: bool = False
    """Set by :meth:`LogStorage.create` when it took over a leftover of an earlier create
    (holding no entry) whose own metadata change may have landed, or may still land (its
    answer was lost): that record would name this log, so it is never discarded
    (:meth:`LogStorage.discard`). A file keeps its header's nonce for the same reason."""

    @property
    @abstractmethod
    def count(self) -> int:
        """Number of readable entries (the next entry id of a log being appended to)."""

    @abstractmethod
    def append_batch(self, payloads: Sequence[bytes]) -> None:
        """Append entries ``count .. count+len-1``; durable when this returns, and (file
        storage) marked as acknowledged before it returns.

        Raises:
            LedgerUnwritable: none of the batch is acknowledged and this log takes no more
                (too few replicas answered): close it at ``count`` and write the batch to
                the next ledger.
            LedgerFenced: another owner recovered the ledger.
        """

    async def append_batch_async(self, payloads: Sequence[bytes]) -> None:
        """:meth:`append_batch` without blocking the event loop: on a worker thread, unless
        the log does its I/O as coroutines itself (a replicated one does: no thread is held
        for its network round trips)."""
        await asyncio.to_thread(self.append_batch, payloads)

    async def read_async(self, first: int, last: int) -> list[bytes]:
        """:meth:`read` without blocking the event loop (as :meth:`append_batch_async`)."""
        return await asyncio.to_thread(self.read, first, last)

    def last_within(self, first: int, last: int, max_bytes: int) -> int:
        """The last entry of ``first..last`` such that a read from ``first`` to it holds
        about ``max_bytes`` (at least ``first``): what a read bounded by bytes asks for, so
        that it reads no more than that. This default says ``last``: a log whose entries'
        sizes are not known without reading them, or cost nothing to read, reads all."""
        return last

    @abstractmethod
    def read(self, first: int, last: int) -> list[bytes]:
        """Entries ``first..last`` inclusive; fewer (from ``first``) when a damaged log's
        readable entries end before ``last``.

        Raises:
            LedgerCorrupted: ``first`` is damaged, or an entry fails its checksum.
        """

    @abstractmethod
    def size_bytes(self) -> int: ...

    @abstractmethod
    def close(self) -> None:
        """Release the log (and the exclusive hold on it). Idempotent."""


class Recovered(NamedTuple):
    log: EntryLog
    truncation: Truncation | None
    """What was cut off its end (None: nothing; the log is exactly as it was written)."""


class LogStorage(ABC):
    """Where the entry logs of every managed ledger on this broker live."""

    @abstractmethod
    def where(self, ledger_name: str, ledger_id: int) -> str:
        """Where the log is kept (a path), for messages."""

    @abstractmethod
    def exists(self, ledger_name: str, ledger_id: int) -> bool:
        """Whether the log's file exists (for memory storage: whether it is held)."""

    @abstractmethod
    def create(self, ledger_name: str, ledger_id: int) -> EntryLog:
        """A new, empty log, durable (file and directory entry synced, or created on
        its replicas) when this returns: create the log *before* the metadata names it
        (with its ``placement``), so that a log the metadata names always exists. A
        leftover from a create whose metadata change never happened (no entries) is
        reused (:attr:`EntryLog.reused`), keeping its identity (a file's nonce).

        Raises:
            LedgerFenced: another handle (in this or another process) holds the log.
            LedgerCorrupted: a file with entries already exists under this id (its
                metadata was lost); it is never overwritten.
        """

    @abstractmethod
    def recover(
        self,
        ledger_name: str,
        ledger_id: int,
        *,
        log_format: int,
        tail_bytes: int,
        placement: Placement = LOCAL,
        nonce: int | None = None,
    ) -> Recovered:
        """Open the log a crashed (or killed) writer was appending to, exclusively.

        Whatever the log holds is made durable first. A torn, never-acknowledged tail is
        truncated and reported; damage to acknowledged entries is refused
        (:mod:`segtxn.ledger.recovery` has the rules). ``tail_bytes``: the most one batch
        of that writer spans on disk. ``log_format``: ``LedgerInfo.format``.
        ``placement``: ``LedgerInfo.placement`` (a replicated log is fenced on its
        replicas first, so its old writer can add nothing more). ``nonce``:
        ``LedgerInfo.nonce`` (None: not recorded, nothing to check).

        Raises:
            LedgerMissing: the log does not exist.
            LedgerMismatch: its file is another ledger's (another nonce); it is left as
                it is, before anything is truncated.
            LedgerCorrupted: damage a crash cannot explain.
            LedgerFenced: another handle holds the log.
        """

    @abstractmethod
    def open(
        self,
        ledger_name: str,
        ledger_id: int,
        *,
        log_format: int,
        entries: int,
        size_bytes: int | None = None,
        placement: Placement = LOCAL,
        nonce: int | None = None,
    ) -> EntryLog:
        """Open a closed log (``entries`` and ``size_bytes`` recorded when it closed; the
        size None: not recorded) exclusively, for reading; it is never changed. Damage
        does not fail the open: the log's ``damage`` says where its readable entries end,
        and why; its ``alteration`` says how a log holding all of them changed since
        (reads never go past them). ``nonce``: as for :meth:`recover`.

        Raises:
            LedgerMissing: the log does not exist.
            LedgerMismatch: its file is another ledger's (another nonce).
            LedgerFenced: another handle holds the log.
        """

    def verify_identity(self, ledger_name: str, ledger_id: int, nonce: int | None) -> None:  # noqa: B027
        """Check that the log kept under this ledger's name is this ledger's: its file's
        header holds ``nonce`` (``LedgerInfo.nonce``; None: not recorded, nothing to check).
        The file is only read: not locked (its owner may hold it), never changed. A missing
        log, or one without a valid header, is not decided here (opening it refuses it).
        This default: storage without nonces (memory) has nothing to check.

        Raises:
            LedgerMismatch: the file holds another nonce (another cluster's volume, a
                restored copy of another incarnation of the topic).
        """

    @abstractmethod
    def delete(self, ledger_name: str, ledger_id: int, placement: Placement = LOCAL) -> None:
        """Remove a log (idempotent)."""

    def delete_unused(self, ledger_name: str, ledger_id: int) -> bool:
        """Delete the log ``ledger_id`` if it holds no entry and nobody holds it: what a
        create leaves when the metadata change that was to name it failed (the log is
        created first). Called for the record's ``next_ledger_id`` (where that create
        made it, and where no other ledger of this name lives) when the managed ledger is
        deleted; a log with entries, or one held (a create whose change is still on its
        way, an open log), is left. Returns whether it deleted one. This default: storage
        that cannot tell keeps it.

        Raises:
            DeleteFailed: it could not be removed.
        """
        return False

    def discard(self, ledger_name: str, entry_log: EntryLog) -> bool:
        """Close ``entry_log``, made by :meth:`create` for a metadata change that the store
        refused (known not to have landed: no record names it, nor ever will), and remove
        it if no one else can have a use for it; returns whether it was removed. Best
        effort: a log left behind is reused by the next create of its id, deleted with its
        managed ledger (:meth:`delete_unused`), or swept (replicas).

        Kept: a log that :meth:`create` reused (:attr:`EntryLog.reused`: the earlier
        create's change may be the one that landed, naming it), and one that holds entries
        or that somebody holds again (:meth:`delete_unused`). This default removes it
        through :meth:`delete_unused`.

        Raises:
            DeleteFailed: it could not be removed.
        """
        entry_log.close()
        if entry_log.reused:
            return False
        return self.delete_unused(ledger_name, entry_log.ledger_id)

    def delete_leftovers(self, ledger_name: str, first_id: int) -> int:
        """Delete the logs a crash during a trim left behind, below ``first_id`` (the first
        ledger the metadata names); returns how many. A trim removes its ledgers from the
        metadata, then deletes their files oldest first, so a crash in between leaves the
        newest of them, right below ``first_id`` (ledger ids only grow): scan down from
        there to the first absent one. Left, they held the disk, and a ledger made again
        under the same name later refused to overwrite them."""
        ledger_id, deleted = first_id - 1, 0
        while ledger_id > 0 and self.exists(ledger_name, ledger_id):
            self.delete(ledger_name, ledger_id)
            deleted += 1
            ledger_id -= 1
        return deleted


async def open_in_thread(open_log: Callable[..., EntryLog], *args: Any, **kwargs: Any) -> EntryLog:
    """``open_log(*args, **kwargs)`` (a storage's create, open or recovery) in a worker
    thread. If the caller is cancelled meanwhile the thread still finishes, and the log it
    opened is closed then rather than left open: an open log holds its file's lock, and a
    leaked one made every later open of that ledger in this process fail with "held by
    another writer" (a coordinator stopped while it took over a v4 log, then started again
    in the same process, never took it back)."""
    opening = asyncio.ensure_future(asyncio.to_thread(open_log, *args, **kwargs))
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        opening.add_done_callback(_close_opened)
        raise


def _close_opened(opening: asyncio.Future[EntryLog]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()


async def close_log_after_cut(name: str, storage: LogStorage, entry_log: EntryLog) -> None:
    """Close ``entry_log``, a log of the managed ledger ``name`` that a step failed or
    cancelled part-way had opened (an open, a rollover), in that step's ``except
    BaseException:`` handler: the close's failure (an ``OSError`` releasing its file) is
    logged at WARNING naming the ledger and the file, and what cut the step propagates
    (:func:`~segtxn.ledger.errors.close_after_cut`).

    The close runs to its end even if this is cancelled meanwhile (shielded): a cancel
    that reached it before its worker thread had started it (a pending-ack log's
    compaction, whose rollover met another owner's fence, cancelled by the close of the
    topic that fence unloads) left the new file open and locked, and every later load of
    the topic on this broker failed, "held by another writer"."""
    what = f"{name}: {storage.where(name, entry_log.ledger_id)}"
    closing = asyncio.ensure_future(asyncio.to_thread(entry_log.close))
    try:
        await close_after_cut(asyncio.shield(closing), what)
    except asyncio.CancelledError:  # (its failure, if any, is said when it ends)
        closing.add_done_callback(functools.partial(_closed_late, what))
        raise


def _closed_late(what: str, closing: asyncio.Future[None]) -> None:
    if not closing.cancelled() and (error := closing.exception()) is not None:
        log.warning("%s: closing it after the step that opened it was cut short failed: %s: %s",
                    what, type(error).__name__, error)  # fmt: skip
