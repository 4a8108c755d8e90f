"""Appending to a managed ledger: its write half, rollovers included.

The append half of :class:`~segtxn.ledger.managed.ManagedLedger` (which extends this), as
:mod:`segtxn.ledger.reads` is its read half. An append is checked (closed, sealed, too
large, or after a failed write: refused), queued in the group-commit writer
(:mod:`segtxn.ledger.writer`: the bounded queue and the one task that drains it), and
written a batch at a time into the ledger being appended to; a batch is durable and marked
acknowledged before any of its entries is acknowledged.

A ledger that is full, or that can take no more (``LedgerUnwritable``), is rolled over
first: the next ledger's file is created and synced *before* one metadata CAS closes the
current ledger and names the new one, so a crash leaves the chain as it was or as it
became, and every ledger the record names has its file. That CAS goes through
:meth:`LedgerAppends._update`, the one path of every change of the metadata record (the
managed ledger's seal, clean close, properties, trims and placement moves take it too):
changes are serialised, each expecting the version the previous one wrote, so a failed
CAS means another process owns the ledger now (``LedgerFenced``) — unless the record holds
a state this owner tried itself, whose answer and read-back were lost
(:mod:`segtxn.ledger.fencing`): that state is taken up and the change applied on it. A
cancel of the caller lets a change's CAS end first, and what it changed in memory is done
with it: the ledger never holds a state of its own in doubt for a cancel (a compaction
stopped by its log's close, say). It lives here because the write path is what needs it
first; the managed ledger's other changes build on it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import msgspec

from segtxn.aio import run_to_end
from segtxn.ledger.errors import (
    EntryTooLarge,
    LedgerClosed,
    LedgerError,
    LedgerFenced,
    LedgerSealed,
    LedgerUnwritable,
    WriteFailed,
    full_disk_is_retriable,
)
from segtxn.ledger.fencing import (
    NotLanded,
    OutcomeUnknown,
    TriedWrites,
    cas_put,
    own_landed_write,
)
from segtxn.ledger.logs import EntryLog, LogStorage, close_log_after_cut, open_in_thread
from segtxn.ledger.metadata import (
    LedgerInfo,
    LedgerMetadata,
    LedgerSettings,
    closed,
    decode,
    encode,
    metadata_key,
    opened,
)
from segtxn.ledger.position import Position
from segtxn.ledger.reads import LedgerReads
from segtxn.ledger.records import ENTRY_OVERHEAD
from segtxn.ledger.writer import WriteStats
from segtxn.metastore import MetadataStore, MetadataStoreError

log = logging.getLogger(__name__)


class LedgerAppends(LedgerReads):
    """Appends and rollovers over the chain of ledgers (see the module docstring). The
    managed ledger that extends it keeps these attributes current."""

    settings: LedgerSettings
    _store: MetadataStore
    _storage: LogStorage
    _write_lock: asyncio.Lock
    _sealing: bool
    """Set once a seal starts: appends are refused from then on."""
    _closing: bool
    """Set once a close starts: appends are refused from then on."""
    stats: WriteStats
    _tried: TriedWrites
    """The metadata states tried since the last CAS known to land: any may have landed."""
    _let_go: list[LedgerInfo]
    """Ledgers removed from the record and not yet reported: by a trim that seemed to fail
    (its state, found landed, was taken up since), or whose caller was cancelled once it
    landed, or by the trim now ending, which reports them all (:class:`TrimResult`)."""
    on_write_failure: list[Callable[[WriteFailed], None]]

    # ================================================================= appends

    async def append(self, payload: bytes) -> Position:
        """Append one entry; returns its position once it is durable (:meth:`enqueue`,
        then wait for the write).

        Raises:
            LedgerSealed: the ledger is terminated (or being terminated).
            EntryTooLarge: the entry exceeds ``max_entry_bytes``.
            LedgerClosed: the ledger object was closed.
            LedgerError: an earlier write failed (or this one did); reopen the ledger.
        """
        written = await self.enqueue(payload)
        # the entry is written even if the caller stops waiting for it
        return await asyncio.shield(written)

    async def enqueue(self, payload: bytes) -> asyncio.Future[Position]:
        """Queue one entry; returns once it holds its place in the write queue.

        Entries are written in the order they were queued: callers that must keep an order
        (a producer's sends) queue one after another and await the writes in any order.
        This waits only for room (``max_pending_bytes``: backpressure), first come, first
        served. The future resolves to the entry's position once it is durable, or fails
        with ``LedgerError`` if the write fails; the entry is written whether or not anyone
        awaits it.

        Raises:
            LedgerSealed, EntryTooLarge, LedgerClosed, LedgerError: as :meth:`append`.
        """
        self._check_enqueue(payload)
        return await self._writer.enqueue(payload, self._check_writable)

    def enqueue_now(self, payload: bytes) -> asyncio.Future[Position] | None:
        """:meth:`enqueue` where it would not wait (None: it would, and nothing was queued;
        call :meth:`enqueue` then). A plain call, for a caller queueing many entries in a
        row: the coroutine of :meth:`enqueue` per entry was a measurable share of a
        broker's CPU at full rate.

        Raises:
            LedgerSealed, EntryTooLarge, LedgerClosed, LedgerError: as :meth:`enqueue`.
        """
        self._check_enqueue(payload)
        return self._writer.enqueue_now(payload)

    def _check_enqueue(self, payload: bytes) -> None:
        self._check_writable()
        if len(payload) > self.settings.max_entry_bytes:
            raise EntryTooLarge(
                f"entry of {len(payload)} bytes exceeds {self.settings.max_entry_bytes}"
            )

    def _check_writable(self) -> None:
        if self._closing:
            raise LedgerClosed(f"{self.name} is closed")
        if self._sealing:
            raise LedgerSealed(f"{self.name} is sealed: it accepts no more appends")
        if self._writer.failure is not None:
            raise WriteFailed(
                f"{self.name} failed a write ({self._writer.failure}); reopen it",
                self._writer.failure,
            )

    async def _write(self, batch: list[bytes]) -> list[Position]:
        """The group-commit writer's one write: durable (and marked acknowledged) when
        this returns, rolling over to a new ledger first if the current one is full.

        Raises:
            StorageFull: the disk had no room for the batch or for the next ledger's file
                (retriable: the writer stops, and the ledger's owner reopens it).
        """
        async with self._write_lock:
            if self._writer.failure is not None:  # halted while this batch waited
                raise WriteFailed(f"{self.name}: appends stopped", self._writer.failure)
            current = self._current
            if current is None:  # only a sealed ledger has no current log: it queues nothing
                raise LedgerSealed(f"{self.name} is sealed")
            with full_disk_is_retriable():
                if current.count and (
                    current.wants_rollover or current.size_bytes() >= self.settings.max_ledger_bytes
                ):
                    current = await self._roll_over(current)
                try:
                    await current.append_batch_async(batch)
                except LedgerUnwritable as e:  # closed at what it acknowledged; the next one
                    log.warning("%s: %s; starting its next ledger", self.name, e)
                    current = await self._roll_over(current)
                    await current.append_batch_async(batch)
            first = current.count - len(batch)
            self._last = Position(current.ledger_id, current.count - 1)
        self.stats.entries += len(batch)
        self.stats.batches += 1
        self.stats.bytes += sum(len(p) for p in batch)
        on_disk = sum(len(p) + ENTRY_OVERHEAD for p in batch)
        self.stats.largest_batch_bytes = max(self.stats.largest_batch_bytes, on_disk)
        self._notify()
        return [Position(current.ledger_id, first + i) for i in range(len(batch))]

    # ================================================================= rollover

    async def roll_over(self) -> Position:
        """Close the ledger being appended to, if it holds entries, and start the next.

        Returns where the next append goes. Entries durable before the call stay in the
        earlier ledgers, and appends queued after it returns go to the new one: a caller
        that lets no append of its own be in flight (the v4 transaction log's compaction)
        gets a cut that whole-ledger trimming can use. Durable when it returns (one CAS).

        Raises:
            LedgerSealed, LedgerClosed, LedgerError: as :meth:`append`.
            LedgerFenced: another process owns the ledger now.
            StorageFull: no room for the next ledger's file (nothing changed; retriable).
            OutcomeUnknown: the store was unreachable, and whether the rollover landed is
                unknown: the ledger refuses appends from then on, as after a failed write
                (``on_write_failure``); its owner reopens it, which finds out.
        """
        self._check_writable()
        async with self._write_lock:
            current = self._current
            if current is not None and current.count:
                with full_disk_is_retriable():
                    try:
                        await self._roll_over(current)
                    except OutcomeUnknown as e:
                        # the record may have closed ``current`` and named the next ledger,
                        # or not: an append could go to neither without being lost
                        self._writer.halt(e)
                        raise
        return self.next_write_position()

    async def _roll_over(self, current: EntryLog) -> EntryLog:
        """Close ``current`` and start the next ledger. Its file is created (and synced)
        before the metadata names it: a named ledger always has its file."""
        new_id = self._meta.next_ledger_id  # only the writer, here, takes ledger ids
        fresh = await open_in_thread(self._storage.create, self.name, new_id)

        def roll(meta: LedgerMetadata) -> LedgerMetadata:
            if meta.next_ledger_id != new_id:
                raise LedgerError(f"{self.name}: ledger id {new_id} was taken meanwhile")
            now_ms = int(time.time() * 1000)
            closing = closed(meta.ledgers[-1], current.count, current.size_bytes(), now_ms)
            ledgers = [*meta.ledgers[:-1], closing, opened(fresh, now_ms)]
            return msgspec.structs.replace(meta, ledgers=ledgers, next_ledger_id=new_id + 1)

        async def switch(_: LedgerMetadata) -> None:  # run with the CAS (see _update)
            self.stats.rollovers += 1
            self._logs.add(fresh)
            self._current = fresh

        try:
            await self._update(roll, landed=switch)
        except BaseException:
            if self._current is not fresh:  # (landed, then its caller was cancelled: in use)
                await close_log_after_cut(self.name, self._storage, fresh)  # (not raised)
            raise
        return fresh

    # ================================================================= metadata

    async def _update(
        self,
        change: Callable[[LedgerMetadata], LedgerMetadata | None],
        *,
        landed: Callable[[LedgerMetadata], Awaitable[None]] | None = None,
    ) -> LedgerMetadata:
        """Apply ``change`` to the current metadata and CAS the result (None: no change).

        Updates are serialised, so each CAS expects the version the previous one wrote; a
        failed CAS means another process owns the ledger now, unless the record holds a
        state this owner tried (:meth:`_take_up_own_write`): then ``change`` is applied
        again, on that state. ``change`` may be called more than once.

        A cancel of the caller does not stop the CAS half-way: it takes effect once the
        CAS is known to have landed or not, and what it did is recorded (with ``landed``,
        called with the new state once it landed: what the change means in memory, such
        as a rollover's next ledger, which must not be lost between the CAS and the
        caller). Stopped while its answer was awaited, the CAS was left to land unseen: a
        compaction cancelled by its log's close had rolled the ledger over in the store
        only, and the close's own write was then fenced ("a rollover of its own landed
        though it seemed to fail"). So a cancel waits for the store's answer, for at most
        :data:`~segtxn.aio.CANCEL_GRACE_S` (:func:`~segtxn.aio.run_to_end`): past it the
        CAS is abandoned, in doubt, as one whose answer was lost. A change made while its
        caller unwinds from a cancel (a close in a ``finally``) gets what is left of that
        cancel's grace.

        Raises:
            LedgerFenced: another owner changed the record (or it holds a rollover of this
                owner's own that cannot be taken up): the ledger stops taking appends and
                tells its owner, as :meth:`fenced` does. A change that met the fence is
                proof of it, whichever it was: a compacted log's rollover, a trim, a
                property's change. Raised alone, it was logged by its caller ("compaction
                failed, retried later") and the ledger's appends went on, on a ledger
                another process owned, until one of them met the fence in its turn.
            NotLanded: the store could not be reached; the change did not land, and never
                will (the version it now expects is the record's new one).
            StoreUnavailable: the store cannot be reached (the write may have landed: the
                next change, or a cursor's save, finds out).
        """
        async with self._meta_lock:
            return await run_to_end(
                self._compare_and_set(change, landed), name=f"ledger-metadata-{self.name}"
            )

    async def _compare_and_set(
        self,
        change: Callable[[LedgerMetadata], LedgerMetadata | None],
        landed: Callable[[LedgerMetadata], Awaitable[None]] | None,
    ) -> LedgerMetadata:
        """(Under the metadata lock, run to its end.) The body of :meth:`_update`."""
        while True:
            meta = change(self._meta)
            if meta is None:
                return self._meta
            encoded = encode(meta)
            self._tried.add(encoded)
            try:
                key = metadata_key(self.name)
                version = await cas_put(self._store, key, encoded, self._version)
            except LedgerFenced as fence:
                try:
                    taken_up = await self._take_up_own_write()
                except LedgerFenced as own:  # a rollover of its own it cannot take up
                    self.fenced(own)
                    raise
                if not taken_up:  # another owner's change: proof, whichever change met it
                    self.fenced(fence)
                    raise
                continue
            except (NotLanded, OutcomeUnknown) as e:
                if (version_now := self._tried.failed(e)) is not None:
                    self._version = version_now
                raise
            self._tried.clear()
            self._meta, self._version = meta, version
            if landed is not None:
                await landed(meta)
            return meta

    async def settled_metadata_version(self, *, strict: bool = False) -> int:
        """The metadata record's version once no change of this owner's is in flight, nor
        in doubt: a state it tried that landed unseen is taken up first, so a write
        conditional on the record (a cursor's save) that failed on it is tried again
        rather than taken for fenced. When that cannot be done (the store fails, or the
        state is one that needs a reopen), the version is the last one known, as before,
        unless ``strict``.

        Raises:
            MetadataStoreError, LedgerFenced: (``strict`` only) a change of this owner's is
                in doubt and could not be settled: the record could not be read (the store
                did not answer, refused, or is closed), or it holds a rollover of this
                owner's own (``LedgerFenced``: reopen the ledger). Whether the record moved
                under this owner or another is not known. A caller that takes an unchanged
                version for another owner's change (a fence) asks for this, so as not to
                say so when it cannot tell: :func:`~segtxn.ledger.ownership.changed_by_its_owner`.
        """
        async with self._meta_lock:
            try:
                await run_to_end(self._take_up_own_write(), name=f"ledger-take-up-{self.name}")
            except (LedgerFenced, MetadataStoreError):
                if strict:
                    raise
            return self._version

    async def _take_up_own_write(self) -> bool:
        """(Under the metadata lock.) Whether the record holds a metadata state this owner
        tried since its last CAS known to land (a change whose answer and read-back were
        lost). If so, it becomes the current state, and what that change would have done
        in memory is done now: trimmed ledgers' files deleted, moved ledgers' logs reopened
        where they are now, a sealed ledger's log let go.

        Raises:
            LedgerFenced: the state is a rollover of its own: the log it names was let go
                when the rollover seemed to fail, and appends went on in the previous one,
                which the record has closed. The ledger must be reopened.
            StoreUnavailable: the record could not be read (still unknown).
        """
        key = metadata_key(self.name)
        found = await own_landed_write(self._store, key, self._version, self._tried)
        if found is None:
            return False
        landed, before = decode(found.value), self._meta
        if landed.next_ledger_id != before.next_ledger_id:
            raise LedgerFenced(
                f"{self.name}: a rollover of its own landed though it seemed to fail (its "
                "answer and the read-back were lost); reopen the ledger"
            )
        self._meta, self._version = landed, found.version
        if landed.sealed:
            self._current = None
        kept = {info.id: info for info in landed.ledgers}
        for info in before.ledgers:
            now = kept.get(info.id)
            if now is None:  # trimmed: deleted now, or once the reads in flight on it end
                self._let_go.append(info)
                await self._logs.doom(info)
            elif now.placement != info.placement:  # moved: read from where it is now (its
                await self._logs.let_go(info.id)  # reads in flight close the old log)
        return True

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def fenced(self, error: LedgerFenced) -> None:
        """Another owner changed the metadata record (a write conditional on it proved it:
        ``error``; a cursor's save, a de-duplication snapshot, an op record), or a cursor's
        record was written by someone else (``CursorOverwritten``: only an open reads it
        again): stop taking appends as after a write that met the fence. What is queued fails, and
        ``on_write_failure`` is told once, however many writes meet the fence after it (its
        owner lets the ledger go: a broker unloads the topic, whose clients look it up again
        and reach the new owner). Without it, a topic whose only writes were acks (its
        producers idle, or sealed) stayed served by a broker that no longer owned it."""
        self._writer.halt(error)

    def watch_write_failure(self, callback: Callable[[WriteFailed], None]) -> None:
        """Call ``callback`` once the writer stops (a failed write, a fence: see
        :attr:`on_write_failure`), or now if it stopped already: a fence proven while the
        ledger's owner was still loading it (a cursor's save in the background) was told
        to no one, and the owner served a ledger that refused every append for ever."""
        self.on_write_failure.append(callback)
        if self._writer.told is not None:
            callback(self._writer.told)

    def stop_with(self, other: LedgerAppends) -> None:
        """Stop taking appends when ``other`` does for a reason reopening may cure (a
        fence, too few replicas, a full disk: ``WriteFailed.retriable``), for the same
        cause: ``other`` is a ledger this one's owner keeps beside it and cannot serve
        without (a topic's subscription's pending-ack log), so the owner's one watcher of
        this ledger (:meth:`watch_write_failure`) lets both go, once, and the next open
        reopens both. A failure that is not retriable (damage) is not passed on: as for
        this ledger's own, its owner keeps it, ``other`` refusing appends.

        Without it, a pending-ack log fenced by another owner stopped alone: nobody watched
        it, the topic stayed served here, and every later transactional ack of the
        subscription was refused for ever, on a broker that may no longer own the topic."""

        def stopped(failure: WriteFailed) -> None:
            if failure.retriable and not self._closing:
                log.warning("%s: %s stopped (%s); so does it", self.name, other.name, failure)
                cause = failure.cause
                self._writer.halt(cause if isinstance(cause, Exception) else failure)

        other.watch_write_failure(stopped)

    def _write_failed(self, failure: WriteFailed) -> None:
        self._notify()  # readers waiting for entries must learn of it too
        for callback in self.on_write_failure:
            callback(failure)
