"""An open cut short (cancelled, or its cursors' read failed) whose ledger's close then fails
raises what cut it, not the close's failure.

``ManagedLedger.open`` closes the ledger it made when reading its cursors fails or is
cancelled (its writer must not outlive it). That close's own failure (here the clean-close
write, refused by a store that is failing anyway) replaced the original exception: a
cancelled open (a broker stopping, a take-over cut short) raised a store error instead of
``CancelledError``, and its caller took it for a failure of the ledger and went on as if
it had not been stopped. The close's failure is now logged at WARNING and what cut the open
propagates.

A compacted log's open closes its ledger likewise when what follows the ledger's open
fails or is cancelled.

Real components: the store on both backends wrapped by the fault injector; real files.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

import pytest

from segtxn.ledger import LedgerSettings, LogStorage, ManagedLedger
from segtxn.ledger.compacted import CompactedLog
from segtxn.ledger.cursor import cursors_prefix
from segtxn.ledger.metadata import metadata_key
from segtxn.metastore import MetadataStore, StoreUnavailable
from segtxn.metastore.faults import FaultInjector
from tests.conftest import faults as injector_of
from tests.conftest import store as both_backends

store = both_backends  # this directory's conftest has a memory store without faults
faults = injector_of

NAME = "persistent://t/n/cut-open"


async def open_with_failing_close(
    faults: FaultInjector,
    open_: Coroutine[Any, Any, object],
    *,
    listing: str,
    operation: str = "range",
) -> asyncio.Task[object]:
    """Start ``open_``; once its chain is opened (its record's write answered), make every
    later write of the record fail (the close's), and ``listing`` its first ``operation``
    on its cursors: "held" (parked until the test cancels the open) or "failed"
    (StoreUnavailable)."""
    created = faults.hold("txn", key_prefix=metadata_key(NAME))
    opening = asyncio.create_task(open_)
    await created.wait_for(1)
    faults.fail(
        "txn", key_prefix=metadata_key(NAME), times=None, error=StoreUnavailable("injected: close")
    )
    if listing == "held":
        held = faults.hold(operation, key_prefix=cursors_prefix(NAME))
        created.release()
        await held.wait_for(1)
    else:
        faults.fail("range", key_prefix=cursors_prefix(NAME), error=StoreUnavailable("listing"))
        created.release()
    return opening


def close_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "injected: close" in r.getMessage()
    ]


async def test_a_cancelled_open_whose_close_fails_raises_its_cancel(
    store: MetadataStore,
    storage: LogStorage,
    faults: FaultInjector,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        open_ = ManagedLedger.open(NAME, store, storage, LedgerSettings())
        opening = await open_with_failing_close(faults, open_, listing="held")
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
    [warning] = close_warnings(caplog)
    assert NAME in warning, warning


async def test_a_failed_open_whose_close_fails_raises_the_reads_failure(
    store: MetadataStore,
    storage: LogStorage,
    faults: FaultInjector,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        open_ = ManagedLedger.open(NAME, store, storage, LedgerSettings())
        opening = await open_with_failing_close(faults, open_, listing="failed")
        with pytest.raises(StoreUnavailable, match="listing"):
            await opening
    [warning] = close_warnings(caplog)
    assert NAME in warning, warning


async def test_a_cancelled_compacted_log_open_whose_close_fails_raises_its_cancel(
    store: MetadataStore,
    storage: LogStorage,
    faults: FaultInjector,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The same in a compacted log's open (a v4 coordinator's transaction log, a broker's
    snapshot log), cancelled while it creates its cursor."""
    with caplog.at_level(logging.WARNING):
        open_ = CompactedLog.open(NAME, store, storage, LedgerSettings())
        opening = await open_with_failing_close(faults, open_, listing="held", operation="txn")
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
    [warning] = close_warnings(caplog)
    assert NAME in warning, warning
