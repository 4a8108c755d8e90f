"""A producer name reused after de-duplication forgot it (its expiry) keeps its new
numbering across a reload of its topic.

The name's first use stored seqs 0..N; idle past the expiry, it was forgotten, and a new
producer under the same name started again from 0. A reload replays the ledger (from the
start, or from a snapshot's position before the first use's entries) and so reads the
entries of both uses: merged, the name's highest stored seq was the first use's. The new
producer's next sends (its own numbering, kept across the reconnect) were then answered as
duplicates of the first use's messages, with their ids, and never stored: acknowledged
messages lost.
"""

from __future__ import annotations

import time

import pytest

from segtxn.broker.dedup import Deduplication
from segtxn.broker.entry import StoredMessage, encode_entry
from segtxn.client import Client, Producer, TopicEnded
from segtxn.client.messages import MessageId
from segtxn.ledger import LedgerSettings, ManagedLedger, MemoryLogStorage
from segtxn.metastore import open_store
from segtxn.protocol.names import TopicName
from tests.broker.conftest import StartBroker
from tests.waiting import wait_until

TOPIC = "persistent://acme/reuse/events"
EXPIRY_S = 2.0
"""Short, but longer than a reload takes: the second use must still be known after it."""
FIRST_USE = 25


async def send_all(producer: Producer, payloads: list[bytes]) -> list[MessageId]:
    return [await producer.send(payload) for payload in payloads]


async def stored(client: Client) -> list[bytes]:
    reader = await client.create_reader(TOPIC, start="earliest", end="latest")
    values: list[bytes] = []
    try:
        while True:
            values.append((await reader.receive(10)).value)
    except TopicEnded:  # everything read
        return values
    finally:
        await reader.close()


@pytest.mark.parametrize("snapshot_every", [1000, 10], ids=["replay-all", "replay-from-snapshot"])
async def test_a_name_reused_after_its_expiry_keeps_its_new_seqs_across_a_reload(
    start_broker: StartBroker, snapshot_every: int
) -> None:
    """``replay-all``: no periodic snapshot, each load replays the whole ledger.
    ``replay-from-snapshot``: the second load's snapshot already holds the new use, and its
    replay starts among the first use's entries."""
    broker = await start_broker(dedup_snapshot_every=snapshot_every, dedup_expiry_s=EXPIRY_S)
    name = TopicName.parse(TOPIC)
    async with Client(broker.settings.advertise_url) as client:
        await client.admin.create_topic(TOPIC)
        first = await client.create_producer(TOPIC, name="p")
        assert isinstance(first, Producer)
        old = await send_all(first, [b"old-%d" % i for i in range(FIRST_USE)])
        await first.close()
        idle_since = time.time()
        await wait_until(lambda: time.time() > idle_since + EXPIRY_S, timeout=3 * EXPIRY_S)
        await broker.service.unload(name)  # its closing snapshot forgets "p"

        second = await client.create_producer(TOPIC, name="p")  # loads it: from seq 0 again
        assert isinstance(second, Producer)
        new = await send_all(second, [b"new-%d" % i for i in range(5)])
        await broker.service.unload(name)  # "p" reconnects, keeping its own numbering
        new += await send_all(second, [b"new-%d" % i for i in range(5, 10)])

        assert not set(new) & set(old), "new sends were answered with the first use's ids"
        assert await stored(client) == [b"old-%d" % i for i in range(FIRST_USE)] + [
            b"new-%d" % i for i in range(10)
        ]
        await second.close()
        third = await client.create_producer(TOPIC, name="p")  # told where the name is
        assert isinstance(third, Producer)
        assert await third.send(b"new-10") not in old
        await third.close()


async def test_a_recovery_without_a_snapshot_goes_by_the_last_use_it_reads() -> None:
    """A crash (no snapshot at all) after the name's reuse: the replay reads the first use
    and then the second; the name's state is the second's, from its first seq."""
    async with open_store("memory://") as store:
        ledger = await ManagedLedger.open(TOPIC, store, MemoryLogStorage(), LedgerSettings())
        try:
            now = int(time.time() * 1000)
            first = Deduplication(TOPIC, store, 1000, expiry_s=5)
            await first.recover(ledger)
            use = first.state("p").use
            for seq in range(20):  # stored 10 s ago
                entry = StoredMessage("p", seq, now - 10_000, b"old", producer_use=use)
                await ledger.append(encode_entry(entry))
            second = Deduplication(TOPIC, store, 1000, expiry_s=5)
            await second.recover(ledger)
            assert "p" not in second.producers  # idle past the expiry: forgotten
            reuse = second.state("p")
            assert reuse.use > use
            positions = []
            for seq in range(3):
                entry = StoredMessage("p", seq, now, b"new", producer_use=reuse.use)
                positions.append(await ledger.append(encode_entry(entry)))
            again = Deduplication(TOPIC, store, 1000, expiry_s=5)
            await again.recover(ledger)
            state = again.state("p")
            assert (state.use, state.last, state.known_from) == (reuse.use, 2, 0)
            assert list(state.recent.values()) == positions
            assert again.state("q").use > reuse.use  # the next name's use is above both
        finally:
            await ledger.close()
