"""Fixtures for managed-ledger tests: each test runs on file-backed and in-memory logs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from segtxn.ledger import FileLogStorage, LedgerSettings, LogStorage, ManagedLedger
from segtxn.ledger.memory import MemoryLogStorage
from segtxn.metastore import MetadataStore, open_store
from tests.ledger.replicas import Cluster

OpenLedger = Callable[..., Awaitable[ManagedLedger]]


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    async with open_store("memory://") as s:
        yield s


@pytest.fixture(params=["file", "memory"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> LogStorage:
    if request.param == "file":
        return FileLogStorage(tmp_path / "ledgers")
    return MemoryLogStorage()


@pytest.fixture
async def open_ledger(store: MetadataStore, storage: LogStorage) -> AsyncIterator[OpenLedger]:
    opened: list[ManagedLedger] = []

    async def open_(name: str = "persistent://t/n/topic", **settings: int | float) -> ManagedLedger:
        ledger = await ManagedLedger.open(name, store, storage, LedgerSettings(**settings))  # type: ignore[arg-type]
        opened.append(ledger)
        return ledger

    yield open_
    for ledger in opened:
        await ledger.close()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    """Storage nodes for replication tests (tests/ledger/replicas.py), none started yet."""
    async with aiohttp.ClientSession() as session:
        nodes = Cluster(tmp_path, session)
        try:
            yield nodes
        finally:
            await nodes.close()
