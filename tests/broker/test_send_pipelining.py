"""A ``send_batch`` of plain sends is published in runs while its producer publishes alone on
the broker, so its ledger syncs the first run while the rest is taken in
(segtxn/broker/intake.py); while another producer publishes too it is taken whole. Either
way every send is stored once, in send order, and answered on its own."""

from __future__ import annotations

import aiohttp

from segtxn.broker import intake
from segtxn.client import Client
from segtxn.protocol.frames import ProducerReady, Receipt, Send
from tests.broker.conftest import StartBroker
from tests.broker.test_publish_together import answers, batch, raw_producer
from tests.wsframes import next_frame

ALONE = "persistent://acme/together/events"  # test_publish_together's raw_producer topic
COUNT = 4 * intake.RUN


async def storage(client: Client, topic: str) -> dict[str, int]:
    stats = await client.admin.stats(topic)
    return dict(stats["storage"])


async def sent_together(ws: aiohttp.ClientWebSocketResponse, seqs: range) -> list[Receipt]:
    """Send plain sends numbered ``seqs`` in one batch; their receipts in seq order."""
    await ws.send_bytes(batch(*(Send(seq=i, payload=b"%d" % i) for i in seqs)))
    got = await answers(ws, len(seqs))
    receipts = [got[i] for i in seqs]
    assert all(isinstance(r, Receipt) and not r.duplicate for r in receipts), receipts
    return [r for r in receipts if isinstance(r, Receipt)]


async def stored(client: Client, topic: str, count: int) -> list[bytes]:
    reader = await client.create_reader(topic, start="earliest")
    values = [(await reader.receive(10)).value for _ in range(count)]
    await reader.close()
    return values


async def test_alone_a_batch_is_synced_in_runs_in_send_order(start_broker: StartBroker) -> None:
    broker = await start_broker(max_pending_sends=COUNT)
    broker.service.intake = intake.Intake(alone_after_s=0.0)
    async with Client(broker.settings.advertise_url) as client:
        await client.admin.create_topic(ALONE)
        async with raw_producer(broker, "p") as ws:
            receipts = await sent_together(ws, range(1))  # a connection's first: whole
            receipts += await sent_together(ws, range(1, COUNT + 1))
        ids = [r.message_id for r in receipts]
        assert ids == sorted(ids) and len(set(ids)) == COUNT + 1
        written = await storage(client, ALONE)
        assert written["entriesWritten"] == COUNT + 1
        # taken whole, the batch is queued before the ledger's first write: one sync each
        assert written["batches"] > 2, written
        assert await stored(client, ALONE, COUNT + 1) == [b"%d" % i for i in range(COUNT + 1)]


async def test_beside_another_producer_a_batch_is_taken_whole(start_broker: StartBroker) -> None:
    broker = await start_broker(max_pending_sends=COUNT)
    broker.service.intake = intake.Intake(alone_after_s=60.0)  # "lately": this whole test
    busy = "persistent://acme/together/busy"
    async with Client(broker.settings.advertise_url) as client:
        await client.admin.create_topic(ALONE)
        await client.admin.create_topic(busy)
        url = f"{broker.settings.advertise_url}/ws/v2/producer/persistent/acme/together/busy"
        async with (
            raw_producer(broker, "p") as ws,
            aiohttp.ClientSession() as session,
            session.ws_connect(f"{url}?name=q") as other,
        ):
            assert isinstance(await next_frame(other), ProducerReady)
            await sent_together(ws, range(1))
            await sent_together(other, range(1))  # another producer, lately
            await sent_together(ws, range(1, 2))  # p published last, not alone lately
            await sent_together(ws, range(2, COUNT + 2))
        written = await storage(client, ALONE)
        assert written == {**written, "entriesWritten": COUNT + 2, "batches": 3}
        assert await stored(client, ALONE, COUNT + 2) == [b"%d" % i for i in range(COUNT + 2)]


async def test_a_duplicate_in_a_later_run_is_answered_as_its_originals(
    start_broker: StartBroker,
) -> None:
    """A send repeated in one batch, its copy falling into a later run than its original:
    a duplicate receipt with the original's id, the message stored once."""
    broker = await start_broker(max_pending_sends=COUNT)
    broker.service.intake = intake.Intake(alone_after_s=0.0)
    async with Client(broker.settings.advertise_url) as client:
        await client.admin.create_topic(ALONE)
        async with raw_producer(broker, "p") as ws:
            await sent_together(ws, range(1))  # a connection's first: whole
            sends = [Send(seq=i, payload=b"%d" % i) for i in range(1, intake.RUN + 1)]
            await ws.send_bytes(batch(*sends, Send(seq=1, payload=b"1")))
            got = [await next_frame(ws) for _ in range(intake.RUN + 1)]
        assert all(isinstance(r, Receipt) for r in got), got
        ones = [r for r in got if isinstance(r, Receipt) and r.seq == 1]
        assert sorted(r.duplicate for r in ones) == [False, True], ones
        assert ones[0].message_id == ones[1].message_id
        assert (await storage(client, ALONE))["entriesWritten"] == intake.RUN + 1
