"""A resend of a message whose receipt never reached its producer gets the message's
original id after its topic moved, not ``-1:-1``: a recovery replays the entries of the
last interval of de-duplication snapshots at least, not only those written after the last
snapshot (found by the soak, seed 109003: a broker fenced and then killed right after
storing a producer's messages, a snapshot taken among them; the resends to the next owner
were answered ``-1:-1``, and the producer could not tell where its messages were)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp

from segtxn.broker.app import BrokerServer
from segtxn.broker.dedup import Deduplication
from segtxn.broker.entry import StoredMessage, encode_entry
from segtxn.client import Client
from segtxn.ledger import LedgerSettings, ManagedLedger, MemoryLogStorage, Position
from segtxn.metastore import open_store
from segtxn.protocol import frames
from segtxn.protocol.frames import ProducerReady, Receipt, Send, SendBatch
from segtxn.protocol.names import TopicName
from tests.broker.conftest import StartBroker
from tests.wsframes import next_frame

TOPIC = "persistent://acme/resend/events"
PATH = "persistent/acme/resend/events"
EVERY = 10


@asynccontextmanager
async def raw_producer(broker: BrokerServer) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    url = f"{broker.settings.advertise_url}/ws/v2/producer/{PATH}?name=p"
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        assert isinstance(await next_frame(ws), ProducerReady)
        yield ws


async def receipts(ws: aiohttp.ClientWebSocketResponse, seqs: range) -> dict[int, Receipt]:
    await ws.send_bytes(
        frames.encode(SendBatch(sends=[Send(seq=i, payload=b"%d" % i) for i in seqs]))
    )
    got: dict[int, Receipt] = {}
    for _ in seqs:
        frame = await next_frame(ws)
        assert isinstance(frame, Receipt), frame
        got[frame.seq] = frame
    return got


async def test_resends_after_the_topic_closed_and_loaded_again_get_their_original_ids(
    start_broker: StartBroker,
) -> None:
    broker = await start_broker(dedup_snapshot_every=EVERY)
    async with Client(broker.settings.advertise_url) as client:
        await client.admin.create_topic(TOPIC)
    async with raw_producer(broker) as ws:
        first = await receipts(ws, range(25))  # two periodic snapshots among them
    await broker.service.unload(TopicName.parse(TOPIC))  # and the one it takes as it closes
    async with raw_producer(broker) as ws:  # loads it again: snapshot, then the replay
        again = await receipts(ws, range(25 - EVERY, 25))
    assert all(r.duplicate for r in again.values())
    assert {s: r.message_id for s, r in again.items()} == {
        s: first[s].message_id for s in range(25 - EVERY, 25)
    }


async def test_a_recovery_after_a_periodic_snapshot_knows_the_interval_before_it() -> None:
    """A crash (no closing snapshot) just after a periodic one: the positions of the
    interval before the snapshot are known again (the replay starts where it began)."""
    async with open_store("memory://") as store:
        ledger = await ManagedLedger.open(TOPIC, store, MemoryLogStorage(), LedgerSettings())
        try:
            dedup = Deduplication(TOPIC, store, EVERY)
            await dedup.recover(ledger)
            positions: dict[int, Position] = {}
            for seq in range(2 * EVERY + 3):
                entry = encode_entry(StoredMessage("p", seq, 0, b"x"))
                positions[seq] = await ledger.append(entry)
                if dedup.note_stored("p", seq, positions[seq]):
                    await dedup.snapshot()
            recovered = Deduplication(TOPIC, store, EVERY)
            await recovered.recover(ledger)
            state = recovered.state("p")
            assert state.last == 2 * EVERY + 2
            assert {s: state.recent.get(s) for s in range(EVERY, 2 * EVERY + 3)} == {
                s: positions[s] for s in range(EVERY, 2 * EVERY + 3)
            }
        finally:
            await ledger.close()
