"""A de-duplication snapshot vouches only for entries whose sends were all settled.

A send's entry is durable before its producer's state notes it stored: a transactional
send's is recorded in its transaction first (a store write, issue 16's ``append_together``),
a plain batch's once every write of the batch is done (``Publishing.publish_plain``).
Meanwhile other producers' later entries are noted, and a periodic snapshot can be taken.
Its ``position`` (where a recovery's replay starts) and ``taken_at`` (how far an unreadable
look-back may be skipped) were the last entries noted: past the unnoted entry, whose
producer's highest seq the snapshot did not have. After a crash the recovery never read
that entry, and the resend of its message (its receipt lost with the broker) was stored a
second time. The first two scenarios make the publishing path's order by hand, on a real
ledger (the second one on files, with an entry damaged as a disk would); the last one makes
it through a broker, its transaction's record held in the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from segtxn.broker.dedup import Deduplication
from segtxn.broker.entry import StoredMessage, encode_entry
from segtxn.client import Client
from segtxn.ledger import FileLogStorage, LedgerSettings, ManagedLedger, Position
from segtxn.ledger.records import HEADER_SIZE, decode_header, scan
from segtxn.metastore import MetadataStore, open_store
from segtxn.protocol import frames
from segtxn.protocol.frames import ProducerReady, Receipt, Send, SendBatch
from segtxn.protocol.names import TopicName
from tests.cluster import Cluster
from tests.wsframes import next_frame

TOPIC = "persistent://acme/unsettled/events"
EVERY = 4


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    async with open_store("memory://") as s:
        yield s


async def store_plain(dedup: Deduplication, ledger: ManagedLedger, seqs: range) -> None:
    """Sends of producer "p", each noted as soon as it is durable (snapshots as due)."""
    for seq in seqs:
        position = await ledger.append(encode_entry(StoredMessage("p", seq, 0, b"p" * 100)))
        if dedup.note_stored("p", seq, position):
            await dedup.snapshot()


async def slow_send_around(
    dedup: Deduplication, ledger: ManagedLedger, others: range, *, before: range = range(0)
) -> Position:
    """Producer "t"'s send 0 taken in and durable, then ``others`` of "p" stored and
    snapshotted, and only then "t"'s send noted (its transaction recorded at last)."""
    await store_plain(dedup, ledger, before)
    t = dedup.state("t")
    original = asyncio.get_running_loop().create_future()
    t.take_in(0, original, ledger.last_confirmed)
    position = await ledger.append(encode_entry(StoredMessage("t", 0, 0, b"t", txn=(1, 1))))
    await store_plain(dedup, ledger, others)
    t.in_flight.pop(0)
    original.set_result(position)
    dedup.note_stored("t", 0, position)
    return position


async def test_a_recovery_replays_an_entry_noted_after_snapshots_passed_it(
    store: MetadataStore, tmp_path: Path
) -> None:
    """Two intervals of "p" while "t"'s send waits for its record: both snapshots' replay
    starts ("position") were past "t"'s entry. A crash after "t"'s receipt: "t" resends."""
    ledger = await ManagedLedger.open(TOPIC, store, FileLogStorage(tmp_path), LedgerSettings())
    dedup = Deduplication(TOPIC, store, EVERY)
    await dedup.recover(ledger)
    await slow_send_around(dedup, ledger, range(1, 3 * EVERY), before=range(1))
    await ledger.close()  # a crash: no closing snapshot
    ledger = await ManagedLedger.open(TOPIC, store, FileLogStorage(tmp_path), LedgerSettings())
    try:
        recovered = Deduplication(TOPIC, store, EVERY)
        await recovered.recover(ledger)
        assert recovered.state("t").last == 0, "t's stored send would be stored again"
    finally:
        await ledger.close()


def flip_entry(path: Path, entry_id: int) -> None:
    data = path.read_bytes()
    offset = scan(data, start=HEADER_SIZE, nonce=decode_header(data, 1)).offsets[entry_id]
    with path.open("r+b") as f:
        f.seek(offset + 40)
        f.write(b"\xff\xff")


async def test_an_unreadable_look_back_is_skipped_only_up_to_what_the_snapshot_holds(
    store: MetadataStore, tmp_path: Path
) -> None:
    """A snapshot while "t"'s send waits: its ``taken_at`` was past "t"'s entry. The
    look-back before it holds a damaged entry: the recovery skipped to after ``taken_at``,
    over "t"'s entry, though the snapshot did not have it."""
    storage = FileLogStorage(tmp_path)
    ledger = await ManagedLedger.open(TOPIC, store, storage, LedgerSettings())
    dedup = Deduplication(TOPIC, store, EVERY)
    await dedup.recover(ledger)
    await store_plain(dedup, ledger, range(1))
    await ledger.roll_over()  # "p"'s first entry alone in a closed ledger
    await slow_send_around(dedup, ledger, range(2, EVERY), before=range(1, 2))
    await ledger.close()  # a crash: no closing snapshot
    flip_entry(storage.path(TOPIC, 1), 0)  # unreadable: in the look-back
    ledger = await ManagedLedger.open(TOPIC, store, storage, LedgerSettings())
    try:
        recovered = Deduplication(TOPIC, store, EVERY)
        await recovered.recover(ledger)
        assert recovered.state("t").last == 0, "t's stored send would be stored again"
        assert recovered.state("p").last == EVERY - 1
    finally:
        await ledger.close()


SCALABLE = "topic://acme/unsettled/orders"
SEGMENT = TopicName.parse("segment://acme/unsettled/orders/0")


@asynccontextmanager
async def raw_producer(
    cluster: Cluster, name: str
) -> AsyncIterator[tuple[aiohttp.ClientWebSocketResponse, ProducerReady]]:
    url = f"{cluster.url}/ws/v2/producer/{SEGMENT.path}?name={name}"
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        ready = await next_frame(ws)
        assert isinstance(ready, ProducerReady)
        yield ws, ready


async def receipts(ws: aiohttp.ClientWebSocketResponse, *sends: Send) -> list[Receipt]:
    await ws.send_bytes(frames.encode(SendBatch(sends=list(sends))))
    got = [await next_frame(ws) for _ in sends]
    assert all(isinstance(r, Receipt) for r in got), got
    return sorted((r for r in got if isinstance(r, Receipt)), key=lambda r: r.seq)


async def test_a_transactional_send_recorded_after_snapshots_is_a_duplicate_after_a_reload(
    cluster: Cluster,
) -> None:
    """Through the broker: "t"'s transactional send is durable, its record held in the
    store while "p" stores three intervals (1000 each, a snapshot after each); then the
    segment is unloaded with its closing snapshot lost (as a crash would). The reload's
    replay started past "t"'s entry, and its resend was stored a second time."""
    async with Client(cluster.url) as client:  # (this directory's client has no cluster)
        await client.admin.create_topic(SCALABLE, segments=1)
        txn = await client.transaction().start()
        async with raw_producer(cluster, "p") as (p, _), raw_producer(cluster, "t") as (t, _):
            await receipts(p, Send(seq=0, payload=b"p"))
            held = cluster.faults.hold("txn", key_prefix="/txn-op/", times=1)
            await t.send_bytes(frames.encode(Send(seq=0, payload=b"t", txn=txn.wire_id)))
            await held.wait_for(1)  # durable; its record is held
            for start in range(1, 3001, 1000):
                await receipts(p, *(Send(seq=i, payload=b"p") for i in range(start, start + 1000)))
            publishing = cluster.broker.service.topics[SEGMENT].publishing
            await publishing.settle()  # the last snapshot written
            held.release()
            first = await next_frame(t)
            assert isinstance(first, Receipt) and not first.duplicate
        cluster.faults.fail("txn", key_prefix="/dedup/", times=None)  # no closing snapshot
        try:
            await cluster.broker.service.unload(SEGMENT)
        finally:
            cluster.faults.clear()
        async with raw_producer(cluster, "t") as (t, ready):
            (again,) = await receipts(t, Send(seq=0, payload=b"t", txn=txn.wire_id))
            assert again.duplicate, f"stored twice: at {first.message_id} and {again.message_id}"
            assert again.message_id == first.message_id and ready.last_sequence_id == 0
        await txn.commit()
