"""The v4 checks' stop (segtxn/broker/txn/v4checks.py) ends in a bounded time, whatever its
sweep is doing.

It cancelled its sweep and its checks in flight and waited for them without a bound; and,
run as a step of a broker's stop (:class:`~segtxn.stopping.Stopping`, limited only once the
store failed), nothing cut that wait. A sweep ending a transaction on a participant whose
end takes the cancel and goes on (its marker's write waiting for a store that does not
answer) held the broker's stop for as long, before any topic was closed. The stop now waits
for them :data:`~segtxn.stopping.CANCELLED_END_S` at most (:meth:`Stopping.cancel`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from segtxn.broker.settings import V4TxnSettings
from segtxn.broker.txn.v4checks import V4TransactionChecks
from segtxn.metastore import MetadataStore, open_store
from segtxn.protocol.txn import TxnAction, TxnId
from segtxn.stopping import CANCELLED_END_S, Stopping

SLACK_S = 2.0
AT_ONCE = V4TxnSettings(check_timeout_s=1.0, grace_s=0.0, max_timeout_s=0.0, sweep_s=0.01)
"""A transaction found open, its coordinator away, is aborted by the first sweep."""


class SilentEnd:
    """A participant whose end never gets its marker written, and which, cancelled, waits
    for that write's answer (until :attr:`release`)."""

    def __init__(self) -> None:
        self.ending, self.cancelled = asyncio.Event(), asyncio.Event()
        self.release = asyncio.Event()

    async def end(self, txn: TxnId, action: TxnAction) -> bool:
        self.ending.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            await self.release.wait()
            raise
        return True

    def __str__(self) -> str:
        return "persistent://acme/v4stop/t"


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    store = open_store("memory://")
    yield store
    await store.close()


async def test_a_stop_ends_in_its_time_while_its_sweep_ends_a_transaction_that_does_not_end(
    store: MetadataStore, caplog: pytest.LogCaptureFixture
) -> None:
    checks = V4TransactionChecks(store, AT_ONCE)
    participant = SilentEnd()
    checks.recovered(TxnId(0, 1), participant)
    await checks.start()
    stop: asyncio.Task[None] | None = None
    try:
        async with asyncio.timeout(10):
            await participant.ending.wait()  # the sweep aborts it there (no coordinator)
        stopping = Stopping("broker b-v4stop", once_failing=True)
        with caplog.at_level(logging.WARNING):
            stop = asyncio.create_task(checks.stop(stopping))
            done, _ = await asyncio.wait({stop}, timeout=CANCELLED_END_S + SLACK_S)
        assert stop in done, (
            "the v4 checks' stop did not end within the time a stop gives its cancelled "
            "tasks: it waits for a sweep whose end does not end"
        )
        assert participant.cancelled.is_set()
        assert any("v4-txn-sweep" in r.getMessage() for r in caplog.records), [
            r.getMessage() for r in caplog.records
        ]
    finally:
        participant.release.set()
        if stop is not None:
            await asyncio.gather(stop, return_exceptions=True)
