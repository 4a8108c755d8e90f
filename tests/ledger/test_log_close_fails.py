"""A step cut short (failed or cancelled) whose entry log's close then fails raises what cut
it, not the close's ``OSError``.

A managed ledger's open (creating it, or recovering its last ledger and starting the next)
and its rollover close the logs they opened when their metadata write fails or is
cancelled. That close's own failure (an ``OSError`` from the file's release: an I/O error)
replaced the original exception: a cancelled open or rollover (a broker stopping, a
take-over cut short) raised ``OSError`` instead of ``CancelledError``, and a store failure
(retriable) was reported as a disk error. The close's failure is now logged at WARNING,
naming the ledger and the log's file, and what cut the step propagates.

Real components: the in-memory store wrapped by the fault injector; real files and memory
logs, whose close is made to fail after releasing the log (so nothing leaks).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
from collections.abc import Callable, Iterator

import pytest

from segtxn.ledger import LedgerSettings, LogStorage, ManagedLedger
from segtxn.ledger.files import FileEntryLog
from segtxn.ledger.logs import EntryLog
from segtxn.ledger.memory import MemoryEntryLog
from segtxn.ledger.metadata import metadata_key
from segtxn.metastore import MetadataStore, StoreFull, StoreUnavailable
from segtxn.metastore.faults import FaultInjector
from tests.conftest import faults as injector_of
from tests.conftest import store as both_backends

store = both_backends  # this directory's conftest has a memory store without faults
faults = injector_of
pytestmark = pytest.mark.parametrize("store", ["memory"], indirect=True)  # (files fail here)

NAME = "persistent://t/n/log-close-fails"
FAILURE = "injected: log close"


@contextlib.contextmanager
def failing_log_closes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Make every entry log's close release the log, then raise ``OSError`` (EIO)."""

    def failing(cls: type[EntryLog]) -> Callable[[EntryLog], None]:
        close = cls.close

        def close_then_fail(self: EntryLog) -> None:
            close(self)
            raise OSError(errno.EIO, FAILURE)

        return close_then_fail

    with monkeypatch.context() as patched:
        for cls in (FileEntryLog, MemoryEntryLog):
            patched.setattr(cls, "close", failing(cls))
        yield


def close_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and FAILURE in r.getMessage()
    ]


async def reopen_cut(
    store: MetadataStore, storage: LogStorage, faults: FaultInjector, *, cancel: bool
) -> None:
    """Open the ledger again with its record's write failed (StoreFull) or, ``cancel``,
    parked and the open cancelled; raise what the open raises."""
    key = metadata_key(NAME)
    if not cancel:
        faults.fail("txn", key_prefix=key, error=StoreFull("injected: record"))
        await ManagedLedger.open(NAME, store, storage, LedgerSettings())
        return
    held = faults.hold("txn", key_prefix=key, before=True)
    opening = asyncio.create_task(ManagedLedger.open(NAME, store, storage, LedgerSettings()))
    await held.wait_for(1)
    opening.cancel()
    await opening


@pytest.mark.parametrize("cancel", [False, True], ids=["failed", "cancelled"])
async def test_a_reopen_cut_short_whose_log_close_fails_raises_what_cut_it(
    store: MetadataStore,
    storage: LogStorage,
    faults: FaultInjector,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    *,
    cancel: bool,
) -> None:
    ledger = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    await ledger.append(b"kept")
    await ledger.close()
    expected = asyncio.CancelledError if cancel else StoreFull
    with (
        caplog.at_level(logging.WARNING),
        failing_log_closes(monkeypatch),
        pytest.raises(expected),
    ):
        await reopen_cut(store, storage, faults, cancel=cancel)
    warnings = close_warnings(caplog)
    assert len(warnings) == 2, warnings  # the recovered ledger's log and the next one's
    for ledger_id, warning in zip((1, 2), sorted(warnings), strict=True):
        assert warning.startswith(f"{NAME}: {storage.where(NAME, ledger_id)}:"), warning

    faults.clear()
    again = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    first = again.first_position()
    assert first is not None
    assert [e.payload for e in await again.read(first)] == [b"kept"]
    await again.close()


async def test_a_failed_create_whose_log_close_fails_raises_the_stores_failure(
    store: MetadataStore,
    storage: LogStorage,
    faults: FaultInjector,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first ledger's log, kept when the record that was to name it may have landed."""
    faults.fail("txn", key_prefix=metadata_key(NAME), error=StoreUnavailable("injected: record"))
    with (
        caplog.at_level(logging.WARNING),
        failing_log_closes(monkeypatch),
        pytest.raises(StoreUnavailable, match="injected: record"),
    ):
        await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    [warning] = close_warnings(caplog)
    assert warning.startswith(f"{NAME}: {storage.where(NAME, 1)}:"), warning


@pytest.mark.parametrize("cancel", [False, True], ids=["failed", "cancelled"])
async def test_a_rollover_cut_short_whose_log_close_fails_raises_what_cut_it(
    store: MetadataStore,
    storage: LogStorage,
    faults: FaultInjector,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    *,
    cancel: bool,
) -> None:
    """The next ledger's log, created before the record names it. Cancelled, the rollover's
    write is parked before the store applies it: the cancel's grace runs out, and the write
    is abandoned unapplied."""
    ledger = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    try:
        first = await ledger.append(b"before")
        key = metadata_key(NAME)
        with caplog.at_level(logging.WARNING), failing_log_closes(monkeypatch):
            if cancel:
                held = faults.hold("txn", key_prefix=key, before=True)
                rolling = asyncio.create_task(ledger.roll_over())
                await held.wait_for(1)
                rolling.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await rolling
            else:
                faults.fail("txn", key_prefix=key, error=StoreFull("injected: record"))
                with pytest.raises(StoreFull, match="injected: record"):
                    await ledger.roll_over()
        [warning] = close_warnings(caplog)
        next_id = first.ledger_id + 1
        assert warning.startswith(f"{NAME}: {storage.where(NAME, next_id)}:"), warning
        faults.clear()
        after = await ledger.append(b"after")  # the ledger goes on in its current log
        assert after.ledger_id == first.ledger_id
    finally:
        await ledger.close()
