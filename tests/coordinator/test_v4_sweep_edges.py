"""The coordinators' sweeps go on after a failed round: a v4 timeout sweep whose round
raised once (a store or server error, or a bug: a method the sweep calls is made to fail
once) times the transaction out at a later round. The loop ended at the first error it
did not expect, silently, and transactions then never timed out. A real coordinator on a
memory store, its log in files."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.coordinator.txnlog import ABORTED, TIME_OUT
from segtxn.coordinator.v4 import CoordinatorV4
from segtxn.metastore import MetadataStore, MetadataStoreError, open_store
from segtxn.protocol.errors import ErrorName, ServerError
from tests.waiting import wait_until

SWEEP_S = 0.05
FAILURES: dict[str, Callable[[], BaseException]] = {
    "store": lambda: MetadataStoreError("injected: the store is away"),
    "server": lambda: ServerError(ErrorName.SERVICE_NOT_READY, "injected: the id moved"),
    "bug": lambda: RuntimeError("injected: a bug"),
}


class FailsOnce:
    """Wraps ``owner.name`` (an async method) so that its first call for which
    ``when(*args)`` holds raises ``error``; ``failed`` is set once it has."""

    def __init__(
        self, owner: object, name: str, error: BaseException, when: Callable[..., bool]
    ) -> None:
        self.failed = asyncio.Event()
        self._method: Callable[..., Awaitable[Any]] = getattr(owner, name)
        self._error, self._when = error, when
        setattr(owner, name, self)

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.failed.is_set() and self._when(*args, **kwargs):
            self.failed.set()
            raise self._error
        return await self._method(*args, **kwargs)


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    async with open_store("memory://") as s:
        yield s


@pytest.mark.parametrize("failure", list(FAILURES))
async def test_the_v4_timeout_sweep_goes_on_after_a_failed_round(
    store: MetadataStore, tmp_path: Path, failure: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The sweep's TIME_OUT write fails once: the next round times the transaction out."""
    settings = CoordinatorSettings(
        advertise_url="http://127.0.0.1:1",
        v4_coordinator_ids=1,
        ledger_url=f"file://{tmp_path / 'txn-logs'}",
        timeout_sweep_s=SWEEP_S,
    )
    v4 = CoordinatorV4(store, settings)
    await v4.start()
    try:
        await wait_until(lambda: 0 in v4.held, what="v4 id 0 held")
        write = FailsOnce(v4, "_log", FAILURES[failure](), lambda _, meta: meta.state == TIME_OUT)
        txn, _ = await v4.new_txn(timeout_s=0.1)
        await asyncio.wait_for(write.failed.wait(), 10)
        await wait_until(
            lambda: v4.status(txn).state == ABORTED, what=f"{txn} aborted at its timeout"
        )
    finally:
        await v4.stop()
    assert "injected" in caplog.text  # the failed round was logged
