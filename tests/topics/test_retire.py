"""Sealed segments consumed by every subscription and past retention are retired: their
data, their records and their node in the DAG go (segtxn/broker/retire.py, issue 22), and
nothing a subscription still needs goes with them."""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import quote

import pytest

from segtxn.broker.retire import retire_segments
from segtxn.client import Client
from segtxn.client.errors import TopicEnded, TopicNotFound
from segtxn.protocol.errors import ServerError
from segtxn.protocol.names import TopicName
from segtxn.topics.catalog import home_key
from segtxn.topics.model import ScalableTopic, SegmentState
from tests.cluster import Cluster
from tests.waiting import wait_until

TOPIC = "topic://acme/retire/orders"
LATER_MS = (time.time() + 8 * 24 * 3600) * 1000  # past the default week of retention
SEALED = TopicName.parse(TOPIC).segment_name(0)


async def _record(cluster: Cluster) -> ScalableTopic:
    record = await cluster.broker.service.catalog.get(TopicName.parse(TOPIC))
    assert isinstance(record, ScalableTopic)
    return record


async def _keys_of(cluster: Cluster, segment: TopicName) -> list[str]:
    """Every store key naming ``segment`` (quoted or not), transactions' aside."""
    quoted, plain = quote(str(segment), safe=""), str(segment)
    listing = await cluster.store.list_prefix("/")
    return sorted(
        r.key
        for r in listing.records
        if (r.key.endswith(quoted) or f"{quoted}/" in r.key or r.key.endswith(plain))
        and not r.key.startswith("/txn/")
    )


async def _split_with_data(client: Client) -> None:
    """Segment 0 holds five messages of subscription ``s`` when it is split."""
    await client.admin.create_topic(TOPIC, segments=1)
    await client.admin.create_subscription(TOPIC, "s", initial_position="earliest")
    producer = await client.create_producer(TOPIC)
    for i in range(5):
        await producer.send(f"old-{i}".encode(), key=f"k{i}")
    await client.admin.split(TOPIC, 0)
    await producer.close()


async def test_a_consumed_sealed_segment_is_retired_and_its_topic_goes_on(
    cluster: Cluster, client: Client
) -> None:
    service = cluster.broker.service
    await _split_with_data(client)
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
    got = [await consumer.receive(timeout_s=10) for _ in range(4)]
    for message in got:
        await consumer.acknowledge(message)

    # one message unacknowledged: retention keeps it, and so the segment
    assert await retire_segments(service, LATER_MS) == []
    assert (await _record(cluster)).segment(0) is not None
    await consumer.acknowledge(await consumer.receive(timeout_s=10))
    assert await retire_segments(service, time.time() * 1000) == []  # not a week old yet
    await consumer.close()

    assert await _keys_of(cluster, SEALED)  # its ledger, cursor, home...
    root = Path(cluster.broker.settings.ledger_url.removeprefix("file://"))
    logs = root / quote(str(SEALED), safe="")
    assert list(logs.glob("*.log"))
    assert await retire_segments(service, LATER_MS) == [SEALED]
    assert service.metrics.segments_retired.value == 1
    record = await _record(cluster)
    assert record.segment(0) is None  # pruned: it had no parent
    assert all(0 not in s.parents for s in record.segments)
    assert await _keys_of(cluster, SEALED) == []  # every record of its own is gone
    assert SEALED not in service.topics
    assert not logs.exists()  # its data too, and the directory that held it
    assert await retire_segments(service, LATER_MS) == []  # nothing left to do

    # its children carry on, for the old subscription and a new one
    producer = await client.create_producer(TOPIC)
    await producer.send(b"new", key="k1")
    again = await client.subscribe(TOPIC, "s")
    assert (await again.receive(timeout_s=10)).value == b"new"
    fresh = await client.subscribe(TOPIC, "fresh", initial_position="earliest")
    assert (await fresh.receive(timeout_s=10)).value == b"new"
    stats = await client.admin.stats(TOPIC)
    assert sorted(s["id"] for s in stats["segments"]) == [1, 2]
    with pytest.raises(TopicNotFound):
        await client.create_reader(str(SEALED), start="earliest")


async def test_a_transaction_acking_in_the_sealed_segment_holds_it_until_cleaned_up(
    cluster: Cluster, client: Client
) -> None:
    """Acks of an open transaction are op records on the segment: it is not retired while
    they exist, even once every entry is acknowledged otherwise."""
    service = cluster.broker.service
    await _split_with_data(client)
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
    got = [await consumer.receive(timeout_s=10) for _ in range(5)]
    txn = await client.transaction().start()
    await consumer.acknowledge(got[0], txn=txn)
    for message in got[1:]:
        await consumer.acknowledge(message)
    assert await retire_segments(service, LATER_MS) == []  # its first entry is pending
    await txn.commit()
    await consumer.close()

    async def retired() -> bool:
        return await retire_segments(service, LATER_MS) == [SEALED]

    await wait_until(retired, what="the segment retired once the acks are materialized")
    assert (await _record(cluster)).segment(0) is None


async def test_a_retirement_a_crash_interrupted_is_finished_by_the_next_sweep(
    cluster: Cluster, client: Client
) -> None:
    """RETIRED in the record but its data still there (the broker died after step a): the
    segment is never loaded again, and the next sweep deletes it and prunes it."""
    service = cluster.broker.service
    await _split_with_data(client)
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
    for _ in range(5):
        await consumer.acknowledge(await consumer.receive(timeout_s=10))
    await consumer.close()
    loaded = service.topics.pop(SEALED)
    await loaded.close()
    home = await cluster.store.get(home_key(SEALED))
    assert home is not None
    assert not await service.catalog.retire_segment(SEALED, home_version=home.version + 1)
    assert await service.catalog.retire_segment(SEALED, home_version=home.version)
    assert (await _record(cluster)).segment(0).state is SegmentState.RETIRED  # type: ignore[union-attr]
    with pytest.raises(ServerError, match="retired"):
        await service.serve(SEALED)
    assert SEALED not in service.topics
    stats = await client.admin.stats(TOPIC)  # fan-outs skip it
    assert [s["stats"] for s in stats["segments"] if s["id"] == 0] == [None]
    producer = await client.create_producer(TOPIC)
    await producer.send(b"new", key="k1")
    again = await client.subscribe(TOPIC, "s")  # counts the RETIRED parent done
    assert (await again.receive(timeout_s=10)).value == b"new"
    await again.close()

    assert await retire_segments(service, time.time() * 1000) == [SEALED]  # no age needed
    assert (await _record(cluster)).segment(0) is None
    assert await _keys_of(cluster, SEALED) == []


async def test_a_subscription_still_reading_a_parent_keeps_its_children(
    cluster: Cluster, client: Client
) -> None:
    """0 split into 1 and 2, then 1 into 3 and 4. ``s`` read everything; ``fresh``, created
    later, is still in 0 and has no cursor on 1 yet. Nothing retires (parents first), so
    ``fresh`` finds 1 whole when it gets there."""
    service = cluster.broker.service
    await _split_with_data(client)  # 0 -> 1, 2 with old-0..4 in 0
    producer = await client.create_producer(TOPIC)
    in_one = [f"k{i}" for i in range(50) if (await _route(client, f"k{i}")) == 1][:3]
    for key in in_one:
        await producer.send(f"in-1-{key}".encode(), key=key)
    await client.admin.split(TOPIC, 1)  # 1 -> 3, 4
    await producer.close()
    s = await client.subscribe(TOPIC, "s", initial_position="earliest")
    for _ in range(5 + len(in_one)):
        await s.acknowledge(await s.receive(timeout_s=10))
    await s.close()
    fresh = await client.subscribe(TOPIC, "fresh", initial_position="earliest")
    first = await fresh.receive(timeout_s=10)  # in 0
    assert first.value.startswith(b"old-")

    assert await retire_segments(service, LATER_MS) == []
    assert (await _record(cluster)).segment(1).state is SegmentState.SEALED  # type: ignore[union-attr]
    await fresh.acknowledge(first)
    got = {first.value}
    while len(got) < 5 + len(in_one):
        message = await fresh.receive(timeout_s=10)
        got.add(message.value)
        await fresh.acknowledge(message)
    assert {f"in-1-{k}".encode() for k in in_one} <= got  # 1 was there to read


async def test_a_subscription_on_a_parent_alone_is_carried_to_its_children(
    cluster: Cluster, client: Client
) -> None:
    """A subscription whose cursor is on the parent only (its consumer finished the parent
    and went away before reaching the children) is created on the children at their
    start before the parent retires: the children wait for it."""
    service = cluster.broker.service
    await _split_with_data(client)
    producer = await client.create_producer(TOPIC)
    await producer.send(b"in-a-child", key="k1")
    await producer.close()
    s = await client.subscribe(TOPIC, "s", initial_position="earliest")
    for _ in range(6):
        await s.acknowledge(await s.receive(timeout_s=10))
    await s.close()
    await client.admin.create_subscription(str(SEALED), "late", initial_position="latest")

    assert await retire_segments(service, LATER_MS) == [SEALED]
    stats = await client.admin.stats(TOPIC)
    children = {s["id"]: s["stats"]["subscriptions"] for s in stats["segments"]}
    assert sorted(children) == [1, 2]
    assert all("late" in subs for subs in children.values())
    assert sum(subs["late"]["backlog"] for subs in children.values()) == 1


async def test_deleting_a_topic_deletes_a_retired_segment_whose_delete_was_cut_short(
    cluster: Cluster, client: Client
) -> None:
    service = cluster.broker.service
    await _split_with_data(client)
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
    for _ in range(5):
        await consumer.acknowledge(await consumer.receive(timeout_s=10))
    await consumer.close()
    await (service.topics.pop(SEALED)).close()
    home = await cluster.store.get(home_key(SEALED))
    assert home is not None
    assert await service.catalog.retire_segment(SEALED, home_version=home.version)
    await client.admin.delete_topic(TOPIC, force=True)
    assert await _keys_of(cluster, SEALED) == []

    await client.admin.create_topic(TOPIC, segments=1)  # the same name again: a new topic
    reader = await client.create_reader(str(SEALED), start="earliest", end="latest")
    with pytest.raises(TopicEnded):
        await reader.receive(timeout_s=10)  # nothing of the old one
    producer = await client.create_producer(TOPIC)
    await producer.send(b"new", key="k1")


async def _route(client: Client, key: str) -> int:
    """The active segment ``key`` goes to now."""
    from segtxn.protocol.hashing import key_hash

    stats = await client.admin.stats(TOPIC)
    h = key_hash(key)
    return int(
        next(
            s["id"]
            for s in stats["segments"]
            if s["state"] == "ACTIVE" and s["range"][0] <= h <= s["range"][1]
        )
    )
