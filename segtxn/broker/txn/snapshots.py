"""Snapshots of v4 transaction buffers: one log per namespace and broker.

A ``persistent://`` topic's :class:`~segtxn.broker.txn.markers.MarkerTransactionBuffer`
writes its indexes (ongoing transactions and their first entries, aborted ones and their
markers) every so many markers to its namespace's
``persistent://<t>/<ns>/__transaction_buffer_snapshot@<broker>`` log, so recovery replays
only the ledger after the latest one. A topic never moves between brokers, so each broker
keeps its own log, read once when first opened.
"""

from __future__ import annotations

import asyncio

import msgspec

from segtxn.ledger import LedgerSettings, LogStorage, ManagedLedger, Position
from segtxn.metastore import MetadataStore

SNAPSHOT_LOG = "__transaction_buffer_snapshot"


class BufferSnapshot(msgspec.Struct, frozen=True):
    topic: str
    position: tuple[int, int]
    """Every entry up to here is reflected below."""
    ongoing: dict[str, tuple[int, int]]
    """Transaction (``most:least``) -> its first entry."""
    aborted: dict[str, tuple[int, int]]
    """Transaction -> its abort marker."""


_encode = msgspec.json.Encoder().encode
_decode_snapshot = msgspec.json.Decoder(BufferSnapshot).decode


class SnapshotLog:
    """One namespace's ``__transaction_buffer_snapshot`` log on this broker: every
    snapshot is appended; the latest per topic is indexed at open (the log is read once)."""

    def __init__(self, ledger: ManagedLedger) -> None:
        self._ledger = ledger
        self._latest: dict[str, Position] = {}

    @classmethod
    async def open(
        cls, name: str, store: MetadataStore, storage: LogStorage, settings: LedgerSettings
    ) -> SnapshotLog:
        log_ = cls(await ManagedLedger.open(name, store, storage, settings))
        start = log_._ledger.first_position()
        while start is not None:
            entries = await log_._ledger.read(start, max_entries=1000, max_bytes=64 << 20)
            if not entries:
                break
            for entry in entries:
                log_._latest[_decode_snapshot(entry.payload).topic] = entry.position
            start = log_._ledger.position_after(entries[-1].position)
        return log_

    async def write(self, snapshot: BufferSnapshot) -> None:
        self._latest[snapshot.topic] = await self._ledger.append(_encode(snapshot))

    async def latest(self, topic: str) -> BufferSnapshot | None:
        at = self._latest.get(topic)
        if at is None:
            return None
        entries = await self._ledger.read(at, max_entries=1)
        return _decode_snapshot(entries[0].payload) if entries else None

    async def close(self) -> None:
        await self._ledger.close()


class SnapshotLogs:
    """The snapshot logs of the namespaces this broker serves, opened on first use. A
    topic never moves between brokers, so its snapshots are written and read here."""

    def __init__(
        self, broker_id: str, store: MetadataStore, storage: LogStorage, settings: LedgerSettings
    ) -> None:
        self._broker_id = broker_id
        self._store = store
        self._storage = storage
        self._settings = settings
        self._logs: dict[str, asyncio.Task[SnapshotLog]] = {}

    def get(self, tenant: str, namespace: str) -> asyncio.Task[SnapshotLog]:
        name = f"persistent://{tenant}/{namespace}/{SNAPSHOT_LOG}@{self._broker_id}"
        task = self._logs.get(name)
        if task is None or (task.done() and task.exception() is not None):
            task = asyncio.ensure_future(
                SnapshotLog.open(name, self._store, self._storage, self._settings)
            )
            self._logs[name] = task
        return task

    async def close(self) -> None:
        for task in self._logs.values():
            if task.done() and task.exception() is None:
                await task.result().close()
            elif not task.done():
                task.cancel()
        await asyncio.gather(*self._logs.values(), return_exceptions=True)
        self._logs.clear()
