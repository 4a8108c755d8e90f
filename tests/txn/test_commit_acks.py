"""A committed transaction's acks reach the cursor in memory at once and are saved with the
next cursor write (docs/design-notes.md, 15): its acks records wait for that save, and a
sealed segment still ends for its consumers once the save is done."""

from __future__ import annotations

import msgspec

from segtxn.client import Client
from segtxn.ledger import Position
from segtxn.ledger.cursor import CursorState, cursor_key
from segtxn.protocol.names import TopicName
from segtxn.topics import transactions as T
from tests.cluster import Cluster
from tests.waiting import wait_until

TOPIC = "topic://acme/acks/orders"


async def test_a_segment_sealed_with_its_last_acks_in_a_transaction_ends_for_its_consumer(
    client: Client,
) -> None:
    """The consumer moves to the children only once the parent ends, and it ends only once
    the cursor holding the transaction's acks is saved: the save must wake the dispatcher
    (it did not, and a merge stalled every consumer of the merged topic for good)."""
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    for i in range(5):
        await producer.send(f"m{i}".encode(), key="k")
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
    received = [await consumer.receive(timeout_s=10) for _ in range(5)]
    await client.admin.split(TOPIC, 0)
    async with client.transaction() as txn:
        for message in received:
            await consumer.acknowledge(message, txn=txn)
    await producer.send(b"after the split", key="k")
    assert (await consumer.receive(timeout_s=10)).value == b"after the split"


async def test_a_commits_acks_records_stay_while_the_cursor_cannot_be_saved(
    client: Client, cluster: Cluster
) -> None:
    """The records are what a recovery applies again: they go only once a cursor save
    holds the acks. While cursor saves fail they stay; once the store takes them they go,
    and the saved cursor has the acks."""
    await client.admin.create_topic(TOPIC, segments=1)
    segment = str(TopicName.parse(TOPIC).segment_name(0))
    producer = await client.create_producer(TOPIC)
    for i in range(3):
        await producer.send(f"m{i}".encode())
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
    received = [await consumer.receive(timeout_s=10) for _ in range(3)]
    last = max(Position(m.message_id.ledger_id, m.message_id.entry_id) for m in received)
    cursors = cursor_key(segment, "s")
    cluster.faults.fail("txn", key_prefix=cursors, times=None)
    saves = cluster.faults.count("txn", key_prefix=cursors)
    async with client.transaction() as txn:
        for message in received:
            await consumer.acknowledge(message, txn=txn)
    await wait_until(lambda: saves.calls >= 2, what="a cursor save tried again after failing")
    assert (await cluster.store.list_prefix(T.OPS)).records  # kept: the save failed
    cluster.faults.clear()

    async def records_gone() -> bool:
        return not (await cluster.store.list_prefix(T.OPS)).records

    await wait_until(records_gone, timeout=10, what="the acks records deleted after the save")
    saved = await cluster.store.get(cursors)
    assert saved is not None
    assert Position(*msgspec.json.decode(saved.value, type=CursorState).mark_delete) >= last
