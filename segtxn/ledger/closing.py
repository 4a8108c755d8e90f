"""Closing and deleting a managed ledger: its end recorded, its files let go.

The part of :class:`~segtxn.ledger.managed.ManagedLedger` (which extends this) that ends
it. :meth:`LedgerClosing.close` finishes the appends already accepted, records the clean
close (the last ledger's count, so that the next open can tell a lost acknowledged entry
from a torn unacknowledged tail: :mod:`segtxn.ledger.recovery`), saves the cursors, and
releases the writer and the files whatever happened before. It runs once: every caller,
concurrent or later, gets the same outcome (the same bool, or the same exception).
:meth:`LedgerClosing.delete` then removes the logs, the cursors and the metadata record,
in that order, the record last, so that a deletion cut short is found and finished by
doing it again; a file that is not its own refuses it before anything is deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import msgspec

from segtxn.ledger.appends import LedgerAppends
from segtxn.ledger.cursor import ManagedCursor, cursors_prefix
from segtxn.ledger.identity import check_identities, delete_chain
from segtxn.ledger.metadata import LedgerMetadata, closed, metadata_key
from segtxn.metastore import NotFound

log = logging.getLogger(__name__)


class LedgerClosing(LedgerAppends):
    """The close and the deletion (see the module docstring). The managed ledger that
    extends it keeps these attributes current."""

    cursors: dict[str, ManagedCursor]
    """The cursors a close saves (closing each)."""
    _close_ended: asyncio.Event
    """Set once :meth:`close` has released everything: the other callers wait for it."""
    _close_failure: BaseException | None
    """What :meth:`close` raised (None: nothing, or its first caller was cancelled)."""

    @property
    def is_closing(self) -> bool:
        """Whether :meth:`close` was called: this owner let the ledger go (a background
        job that holds it, such as a repair, stops using it)."""
        return self._closing

    async def close(self) -> bool:
        """Finish queued appends, record the clean close, save the cursors, stop the writer,
        release files. Idempotent: every call, the first, one made while it runs and a
        later one, returns once the ledger is closed, with the same outcome: the same
        bool, or the same exception raised again (a broker's stop racing a topic's unload
        must not take a fenced ledger for one left for recovery). A first call cancelled
        part-way is its own task's outcome, not the close's: the others are told whether
        the end was recorded (the metadata change it was making ends first: see
        :meth:`_update`).

        Returns whether the ledger's end is recorded (the clean close, or a seal before).
        False when its writer had stopped (a failed write, a rollover of unknown outcome,
        a fencing): the last ledger's count is then for recovery to judge, so none is
        recorded, and the next open recovers it as after a crash, keeping every
        acknowledged entry (:mod:`segtxn.ledger.recovery`). Said once at WARNING, naming
        the ledger and the failure, and never raised: the failure was raised to the
        appends and told to ``on_write_failure`` already, and those that close ledgers (a
        broker's stop, a topic's unload or delete) must go on closing the rest.

        Raises:
            LedgerFenced, MetadataStoreError: the clean close could not be recorded (the
                files are released all the same).
        """
        if self._closing:
            await self._close_ended.wait()
            return self._close_outcome()
        self._closing = True  # refuse new appends; finish the accepted ones
        try:
            try:
                await self._finish_and_record()
            finally:
                self._closed = True
                await self._writer.close()
                await self._logs.close()
                self._notify()
        except asyncio.CancelledError:
            raise  # (this caller's own: the others get whether the end was recorded)
        except BaseException as e:
            self._close_failure = e
            raise
        finally:
            self._close_ended.set()
        return self._close_outcome()

    async def _finish_and_record(self) -> None:
        """(The first :meth:`close`.) Let the accepted appends end, record the clean close
        (unless a seal recorded the end, or the writer stopped), and save the cursors."""
        await self._writer.idle.wait()
        if self._meta.sealed:
            pass  # its end was recorded by the seal
        elif self._writer.failure is not None:
            log.warning(
                "%s: closed without recording a clean close, as its writer stopped (%s); "
                "its next open recovers its last ledger as after a crash",
                self.name,
                self._writer.failure,
            )
        else:
            await self._record_clean_close()
        for cursor in list(self.cursors.values()):  # (a delete_cursor may run meanwhile)
            await cursor.close()

    def _close_outcome(self) -> bool:
        """(Once :meth:`close` ended.) What it gives every caller: the exception it raised,
        else whether the ledger's end is recorded in the metadata (sealed, or its last
        ledger closed with its count)."""
        if self._close_failure is not None:
            raise self._close_failure
        return self._meta.sealed or self._meta.ledgers[-1].entries is not None

    async def check_deletable(self) -> None:
        """Check, changing nothing, that :meth:`delete` would not refuse this ledger's files:
        a caller that must let go of what uses the ledger before deleting it (a topic hangs
        up on its clients) checks first, so a refusal leaves it all as it was.

        Raises:
            LedgerMismatch: as :meth:`delete`.
        """
        await asyncio.to_thread(check_identities, self.name, self._storage, self._meta.ledgers)

    async def delete(self) -> None:
        """Close the ledger and delete it: its logs, cursors and metadata. Irreversible.

        Raises:
            LedgerMismatch: a file under one of its ledgers' names is another's (a foreign
                volume): it is closed, and nothing was deleted.
        """
        await self.close()
        await delete_chain(self.name, self._storage, self._meta.ledgers, self._meta.next_ledger_id)
        await self._store.delete_range(cursors_prefix(self.name))
        with contextlib.suppress(NotFound):
            await self._store.delete(metadata_key(self.name))

    async def _record_clean_close(self) -> None:
        """Record the last ledger's entry count: after a clean close, recovery can tell
        a lost acknowledged entry (corruption) from a torn unacknowledged tail. Not beside
        a roll_over(): the count recorded for its new ledger would be the old one's, and
        the ledger could never be opened again."""
        async with self._write_lock:
            count = self._current.count if self._current is not None else 0
            size = self._current.size_bytes() if self._current is not None else 0

            def close_last(meta: LedgerMetadata) -> LedgerMetadata:
                last = closed(meta.ledgers[-1], count, size, int(time.time() * 1000))
                ledgers = [*meta.ledgers[:-1], last]
                return msgspec.structs.replace(meta, ledgers=ledgers)

            await self._update(close_last)
