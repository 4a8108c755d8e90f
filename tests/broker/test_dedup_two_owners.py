"""Two owners of one topic writing its de-duplication snapshot: the old one not knowing yet
that it lost the topic (paused, or its session expired), the new one after a take-over.

Whatever order their writes land in, the next load must find a snapshot whose parts are all
there and which reflects the new owner's state: the old owner's writes are refused once the
new owner has opened the ledger, and the parts a record names are never deleted by either.
Before, the old owner's writes were unconditional: its record (written as it let go of the
topic, or held up while the new owner wrote its own) replaced the new owner's, or named
parts the new owner's snapshot had deleted, and its clean-up deleted every part not of its
own generation, the new owner's among them. Once the ledger was trimmed, a reload knew only
what the snapshot held, and that was stale or unreadable: resends of stored messages were
stored again.

Two owners: two store clients over one store, each a managed ledger on its own broker's
replicated storage (real storage nodes, tests/ledger/replicas.py): the new owner's open
fences the old one's, as a take-over does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import NamedTuple

import aiohttp
import pytest

from segtxn.broker.dedup import Deduplication
from segtxn.broker.dedup_snapshots import PREFIX, SnapshotFenced, parts_prefix
from segtxn.broker.entry import StoredMessage, encode_entry
from segtxn.ledger import ManagedLedger, Position, RetentionPolicy
from segtxn.metastore import MetadataStore, Op, Put, Record, StoreSettings
from tests.ledger.replicas import Cluster, started

TOPIC = "persistent://acme/dedup/two-owners"
RECORD = PREFIX + "persistent%3A%2F%2Facme%2Fdedup%2Ftwo-owners"
SETTINGS = StoreSettings(max_value_bytes=4096)
"""Small values: a snapshot of 30 producers with long names is written in parts."""


def names(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i:03d}-".ljust(100, prefix) for i in range(n)]


class PausedOwner(MetadataStore):
    """The old owner's store client: its first write of the de-duplication record waits,
    ``before`` it reaches the store or after it landed, until :attr:`resume` is set (a
    broker paused mid-snapshot)."""

    def __init__(self, engine: MetadataStore, *, before: bool) -> None:
        super().__init__(engine.engine, SETTINGS, owns_engine=False)
        self._before = before
        self.paused = asyncio.Event()
        self.resume = asyncio.Event()

    async def commit(self, ops: Sequence[Op]) -> list[Record | None]:
        pause = not self.paused.is_set() and any(
            isinstance(op, Put) and op.key == RECORD for op in ops
        )
        if pause and self._before:
            self.paused.set()
            await self.resume.wait()
        done = await super().commit(ops)
        if pause and not self._before:
            self.paused.set()
            await self.resume.wait()
        return done


@pytest.fixture
async def nodes(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with aiohttp.ClientSession() as session:
        cluster = Cluster(tmp_path, session)
        try:
            yield await started(cluster, 3)
        finally:
            await cluster.close()


class Owner(NamedTuple):
    ledger: ManagedLedger
    dedup: Deduplication


async def owner(store: MetadataStore, nodes: Cluster, broker: int) -> Owner:
    """Broker ``broker``'s load of the topic: its ledger opened (fencing any other owner's)
    and its de-duplication recovered."""
    ledger = await ManagedLedger.open(TOPIC, store, nodes.storage(broker, write=3, ack=2))
    dedup = Deduplication(TOPIC, store, snapshot_every=10**6)
    await dedup.recover(ledger)
    return Owner(ledger, dedup)


async def store_one_each(owner: Owner, producers: list[str], seq: int) -> Position:
    """One message of each producer stored by ``owner``; the last one's position."""
    now_ms = int(time.time() * 1000)
    positions = [
        await owner.ledger.append(encode_entry(StoredMessage(p, seq, now_ms, b"x")))
        for p in producers
    ]
    for producer, position in zip(producers, positions, strict=True):
        owner.dedup.note_stored(producer, seq, position)
    return positions[-1]


async def trim_everything(ledger: ManagedLedger, last: Position) -> None:
    """Every message consumed and trimmed: the snapshot is all a reload knows of them."""
    cursor = await ledger.open_cursor("all-read", start="earliest")
    await ledger.roll_over()
    await cursor.ack_cumulative(last)
    trimmed = await ledger.trim(RetentionPolicy(retention_time_s=0))
    assert trimmed.entries > 0 and ledger.first_position() is None


@pytest.mark.parametrize(
    "old_owner",
    ["its-last-snapshot-as-it-lets-go", "paused-before-its-record", "paused-before-its-clean-up"],
)
async def test_the_old_owners_snapshot_never_spoils_the_new_owners(
    store: MetadataStore, nodes: Cluster, old_owner: str
) -> None:
    old_names = names("p", 3 if old_owner == "paused-before-its-clean-up" else 30)
    new_names = names("q", 30)
    client_a = PausedOwner(store, before=old_owner == "paused-before-its-record")
    client_b = MetadataStore(store.engine, SETTINGS, owns_engine=False)
    client_c = MetadataStore(store.engine, SETTINGS, owns_engine=False)
    a = await owner(client_a, nodes, 0)
    await store_one_each(a, old_names, 5)
    old_write: asyncio.Task[None] | None = None
    if old_owner != "its-last-snapshot-as-it-lets-go":  # a periodic one, held up
        old_write = asyncio.create_task(a.dedup.snapshot(), name="old-owner-snapshot")
        await asyncio.wait_for(client_a.paused.wait(), 10)

    b = await owner(client_b, nodes, 1)  # the take-over: a's ledger is fenced
    assert {n: s.last for n, s in b.dedup.producers.items()} == dict.fromkeys(old_names, 5)
    await store_one_each(b, old_names, 6)
    last = await store_one_each(b, new_names, 1)
    await b.dedup.snapshot()
    await trim_everything(b.ledger, last)

    if old_write is None:
        old_write = asyncio.create_task(a.dedup.snapshot(), name="old-owner-last-snapshot")
    client_a.resume.set()
    (old_outcome,) = await asyncio.gather(old_write, return_exceptions=True)
    # its snapshot's write met the fence and told its ledger, which stopped: its close
    # records no clean close (the new owner has the ledger)
    assert await a.ledger.close() is False
    await b.ledger.close()

    c = await owner(client_c, nodes, 2)  # a reload: the snapshot is all it has
    try:
        expected = {**dict.fromkeys(old_names, 6), **dict.fromkeys(new_names, 1)}
        assert {n: s.last for n, s in c.dedup.producers.items()} == expected
        parts = await store.list_prefix(parts_prefix(TOPIC))
        assert len({r.key.rsplit("/", 2)[1] for r in parts.records}) == 1  # the named ones
        if old_owner == "paused-before-its-clean-up":  # its record landed before b's open;
            assert old_outcome is None  # its clean-up, after, was refused (and logged)
        else:
            assert isinstance(old_outcome, SnapshotFenced), old_outcome
    finally:
        await c.ledger.close()
        for client in (client_a, client_b, client_c):
            await client.close()


async def test_a_snapshot_racing_its_owners_own_roll_over_is_written(
    store: MetadataStore, nodes: Cluster
) -> None:
    """The ownership check of a snapshot's write meets the ledger's metadata changed by its
    own owner meanwhile (a roll-over): that is no take-over, and the write goes on."""
    producers = names("p", 30)
    client_a = PausedOwner(store, before=True)
    client_b = MetadataStore(store.engine, SETTINGS, owns_engine=False)
    a = await owner(client_a, nodes, 0)
    await store_one_each(a, producers, 5)
    write = asyncio.create_task(a.dedup.snapshot(), name="snapshot")
    await asyncio.wait_for(client_a.paused.wait(), 10)  # its parts written, and checked
    await a.ledger.roll_over()
    client_a.resume.set()
    await write
    await a.ledger.close()
    b = await owner(client_b, nodes, 1)
    try:
        assert {n: s.last for n, s in b.dedup.producers.items()} == dict.fromkeys(producers, 5)
    finally:
        await b.ledger.close()
        await client_a.close()
        await client_b.close()


async def test_the_old_owners_last_snapshot_never_reaches_a_topic_made_again_under_its_name(
    store: MetadataStore, nodes: Cluster
) -> None:
    """The topic is taken over, deleted and made again under its name while its old owner
    is paused; as that one lets go, its snapshot must not become the new topic's. Written,
    the new topic's producer was taken for one that had stored seqs up to 5: its sends 1 to
    5 were answered as duplicates, never stored."""
    (producer,) = names("p", 1)
    client_a = MetadataStore(store.engine, SETTINGS, owns_engine=False)
    client_b = MetadataStore(store.engine, SETTINGS, owns_engine=False)
    a = await owner(client_a, nodes, 0)
    await store_one_each(a, [producer], 5)
    b = await owner(client_b, nodes, 1)  # the take-over, and the deletion
    await b.ledger.delete()
    await b.dedup.delete()
    again = await owner(client_b, nodes, 1)  # made again, its producer starting afresh
    await store_one_each(again, [producer], 0)
    (old_outcome,) = await asyncio.gather(a.dedup.snapshot(), return_exceptions=True)
    assert await a.ledger.close() is False  # (stopped by its snapshot's fence)
    await again.ledger.close()
    reloaded = await owner(client_b, nodes, 2)
    try:
        assert reloaded.dedup.producers[producer].last == 0
        assert isinstance(old_outcome, SnapshotFenced), old_outcome
    finally:
        await reloaded.ledger.close()
        await client_a.close()
        await client_b.close()
