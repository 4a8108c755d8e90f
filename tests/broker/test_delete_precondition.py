"""``DELETE /admin/v2/topic/...?ifProperty=K&ifPropertyValue=V`` (segtxn/broker/deletion.py):
a scalable topic is deleted only if its property holds the value, checked in the store step
that marks it ``deleting``, so a topic deleted and created again between a caller's read and
its delete is not deleted; a malformed precondition is a 4xx. Real broker and store (the
``cluster`` fixture: memory and etcd)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from segtxn.client import (
    Client,
    ErrorName,
    InvalidArgument,
    NotAllowed,
    PreconditionFailed,
    PropertyPrecondition,
    TopicNotFound,
)
from segtxn.protocol.names import TopicName
from segtxn.topics.catalog import home_key, topic_key
from tests.cluster import Cluster

TOPIC = "topic://acme/cond/orders"
PATH = "/admin/v2/topic/acme/cond/orders"
OWNER = "segtxn.io/owner-uid"


@pytest.fixture
async def client(cluster: Cluster) -> AsyncIterator[Client]:
    async with Client(cluster.url) as c:
        yield c


async def exists(client: Client, topic: str = TOPIC) -> bool:
    try:
        await client.admin.stats(topic)
    except TopicNotFound:
        return False
    return True


async def test_the_precondition_decides_what_is_deleted(client: Client) -> None:
    await client.admin.create_topic(TOPIC, segments=2)
    await client.admin.update_properties(TOPIC, {OWNER: "uid-1"})
    producer = await client.create_producer(TOPIC)
    await producer.send(b"kept", key="k")
    await producer.close()

    for wrong in (PropertyPrecondition.equals(OWNER, "uid-2"), PropertyPrecondition.absent(OWNER)):
        with pytest.raises(PreconditionFailed) as refused:
            await client.admin.delete_topic(TOPIC, force=True, precondition=wrong)
        assert refused.value.name is ErrorName.PRECONDITION_FAILED
        assert f"the precondition {wrong} does not hold: it has 'uid-1'" in refused.value.message
        assert await exists(client)
    stats = await client.admin.stats(TOPIC)
    assert sum(s["stats"]["msgInCounter"] for s in stats["segments"]) == 1  # data untouched

    right = PropertyPrecondition.equals(OWNER, "uid-1")
    await client.admin.delete_topic(TOPIC, force=True, precondition=right)
    assert not await exists(client)

    # No such property: "absent" holds, a value does not.
    await client.admin.create_topic(TOPIC)
    with pytest.raises(PreconditionFailed, match="it has no such property"):
        await client.admin.delete_topic(TOPIC, precondition=right)
    await client.admin.delete_topic(TOPIC, precondition=PropertyPrecondition.absent(OWNER))
    assert not await exists(client)
    with pytest.raises(TopicNotFound):
        await client.admin.delete_topic(TOPIC, precondition=right)


async def test_a_topic_replaced_after_the_callers_read_is_not_deleted(client: Client) -> None:
    """The race the precondition exists for, between two calls of the caller: it read the
    topic (its own), someone deleted it and created another under the name, and then the
    caller's delete arrives. Without a precondition the other one would be deleted."""
    await client.admin.create_topic(TOPIC)
    await client.admin.update_properties(TOPIC, {OWNER: "uid-1"})
    read = await client.admin.properties(TOPIC)

    async with Client(client.connector.service_url) as someone_else:
        await someone_else.admin.delete_topic(TOPIC, force=True)
        await someone_else.admin.create_topic(TOPIC, segments=3)

    with pytest.raises(PreconditionFailed, match="it has no such property"):
        await client.admin.delete_topic(
            TOPIC, force=True, precondition=PropertyPrecondition.equals(OWNER, read[OWNER])
        )
    assert (await client.admin.stats(TOPIC))["activeSegments"] == 3


@pytest.mark.parametrize("change", ["replaced", "handed-over"])
async def test_a_change_between_the_brokers_check_and_its_mark_is_seen(
    cluster: Cluster, client: Client, change: str
) -> None:
    """The race inside the broker: its deletion's compare-and-set on the topic's record is
    held (before the store applies it) while the topic is deleted and created again by
    someone else, or handed to another owner; then let go. The mark fails on the changed
    record, which is checked again as it is now: PreconditionFailed, and the other topic is
    whole. (A check made on its own, before an unconditional mark, would delete it.)"""
    await client.admin.create_topic(TOPIC, segments=2)
    await client.admin.update_properties(TOPIC, {OWNER: "uid-1"})
    key = topic_key(TopicName.parse(TOPIC))
    held = cluster.faults.hold("txn", key_prefix=key, times=1, before=True)
    deleting = asyncio.create_task(
        client.admin.delete_topic(
            TOPIC, force=True, precondition=PropertyPrecondition.equals(OWNER, "uid-1")
        ),
        name="the conditional delete",
    )
    try:
        await held.wait_for(1)  # its check passed, and its mark is on its way to the store
        async with Client(cluster.url) as someone_else:
            if change == "replaced":
                await someone_else.admin.delete_topic(TOPIC, force=True)
                await someone_else.admin.create_topic(TOPIC, segments=3)
            await someone_else.admin.update_properties(TOPIC, {OWNER: "uid-2"})
        held.release()
        with pytest.raises(PreconditionFailed) as refused:
            await deleting
    finally:
        held.release()
        if not deleting.done():
            deleting.cancel()
    assert "it has 'uid-2'" in refused.value.message
    assert (await client.admin.properties(TOPIC))[OWNER] == "uid-2"
    stats = await client.admin.stats(TOPIC)
    assert stats["activeSegments"] == (3 if change == "replaced" else 2)
    record = await cluster.broker.service.catalog.get(TopicName.parse(TOPIC))
    assert record is not None and not getattr(record, "deleting", True)  # never marked


async def test_a_deletion_that_stopped_half_way_is_finished_only_as_its_precondition_says(
    cluster: Cluster, client: Client
) -> None:
    """A marked topic (a deletion whose broker died after the mark) keeps its properties:
    a later conditional delete checks them as any other."""
    await client.admin.create_topic(TOPIC)
    await client.admin.update_properties(TOPIC, {OWNER: "uid-1"})
    assert await cluster.broker.service.catalog.mark_deleting(TopicName.parse(TOPIC))
    with pytest.raises(PreconditionFailed):
        await client.admin.delete_topic(TOPIC, precondition=PropertyPrecondition.absent(OWNER))
    await client.admin.delete_topic(TOPIC, precondition=PropertyPrecondition.equals(OWNER, "uid-1"))
    assert not await exists(client)


async def test_the_end_of_a_deletion_leaves_a_topic_created_since_alone(
    cluster: Cluster, client: Client
) -> None:
    """The last step deletes the record it marked, not whatever holds the name: a deletion
    that another one finished (after its mark) while a new topic was created under the name
    deletes nothing of the new topic, not its record nor its segments' homes."""
    catalog = cluster.broker.service.catalog
    name = TopicName.parse(TOPIC)
    await client.admin.create_topic(TOPIC, segments=2)
    mark = await catalog.mark_deleting(name)
    assert mark is not None
    await client.admin.delete_topic(TOPIC)  # another deletion finishes it
    await client.admin.create_topic(TOPIC, segments=2)  # and a new topic takes the name

    assert await catalog.marked(name, mark) is None
    assert not await catalog.finish_deleting(name, mark)
    assert await cluster.store.get(topic_key(name)) is not None
    for segment in (0, 1):
        assert await cluster.store.get(home_key(name.segment_name(segment))) is not None
    producer = await client.create_producer(TOPIC)
    await producer.send(b"the new topic works", key="k")
    await producer.close()


# ---------------------------------------------------------------------- bad input


async def answer(cluster: Cluster, path: str, query: list[tuple[str, str]]) -> tuple[int, Any]:
    """One raw ``DELETE``; (status, JSON body)."""
    async with (
        aiohttp.ClientSession() as http,
        http.delete(cluster.url + path, params=query) as response,
    ):
        return response.status, await response.json()


LONG_KEY = "k" * 257
BAD: list[tuple[list[tuple[str, str]], str]] = [
    ([("ifProperty", ""), ("ifPropertyValue", "v")], "ifProperty is empty"),
    ([("ifProperty", OWNER), ("ifPropertyValue", "")], "ifPropertyValue is empty"),
    ([("ifProperty", OWNER)], "needs exactly one of ifPropertyValue=VALUE"),
    (
        [("ifProperty", OWNER), ("ifPropertyValue", "v"), ("ifPropertyAbsent", "true")],
        "needs exactly one of",
    ),
    ([("ifPropertyValue", "v")], "need ifProperty=KEY"),
    ([("ifPropertyAbsent", "true")], "need ifProperty=KEY"),
    ([("ifProperty", OWNER), ("ifPropertyAbsent", "yes")], "ifPropertyAbsent: 'yes' is not true"),
    ([("ifProperty", OWNER), ("ifPropertyAbsent", "false")], "'false' is not true"),
    ([("ifProperty", LONG_KEY), ("ifPropertyValue", "v")], "ifProperty is 257 bytes"),
    (
        [("ifProperty", "a"), ("ifProperty", "b"), ("ifPropertyValue", "v")],
        "ifProperty given 2 times",
    ),
    ([("ifproperty", OWNER), ("ifPropertyValue", "v")], "unknown parameter 'ifproperty'"),
    ([("force", "true"), ("if-property", OWNER)], "unknown parameter 'if-property'"),
]


@pytest.mark.parametrize(("query", "why"), BAD, ids=[why[:30] for _, why in BAD])
async def test_a_malformed_precondition_is_invalid_argument_and_deletes_nothing(
    cluster: Cluster, client: Client, query: list[tuple[str, str]], why: str
) -> None:
    await client.admin.create_topic(TOPIC)
    await client.admin.update_properties(TOPIC, {OWNER: "v", "a": "v"})
    status, body = await answer(cluster, PATH, query)
    assert (status, body["error"]) == (400, "InvalidArgument"), body
    assert why in body["message"]
    assert await exists(client)


async def test_bytes_that_are_not_utf8_are_a_4xx(cluster: Cluster, client: Client) -> None:
    await client.admin.create_topic(TOPIC)
    for raw in ("ifProperty=%ED%A0%80&ifPropertyValue=v", "ifProperty=k&ifPropertyValue=%FF"):
        async with (
            aiohttp.ClientSession() as http,
            http.delete(f"{cluster.url}{PATH}?{raw}") as response,
        ):
            assert 400 <= response.status < 500, await response.text()
    assert await exists(client)


async def test_the_client_sends_what_the_broker_refuses(client: Client) -> None:
    await client.admin.create_topic(TOPIC)
    with pytest.raises(InvalidArgument, match="ifPropertyValue is empty"):
        await client.admin.delete_topic(TOPIC, precondition=PropertyPrecondition.equals(OWNER, ""))
    with pytest.raises(InvalidArgument, match="ifProperty is empty"):
        await client.admin.delete_topic(TOPIC, precondition=PropertyPrecondition.absent(""))
    assert await exists(client)


async def test_a_precondition_on_a_persistent_topic_or_a_segment_is_not_allowed(
    client: Client,
) -> None:
    """Only a scalable topic's deletion has the step that checks it; elsewhere it is refused,
    not ignored (an ignored precondition is an unconditional delete)."""
    plain = "persistent://acme/cond/plain"
    await client.admin.create_topic(plain)
    await client.admin.update_properties(plain, {OWNER: "uid-1"})
    await client.admin.create_topic(TOPIC)
    precondition = PropertyPrecondition.equals(OWNER, "uid-1")
    with pytest.raises(NotAllowed, match="a persistent topic keeps its properties in its ledger"):
        await client.admin.delete_topic(plain, precondition=precondition)
    with pytest.raises(NotAllowed, match="a segment is deleted only with its topic"):
        await client.admin.delete_topic("segment://acme/cond/orders/0", precondition=precondition)
    assert await exists(client, plain) and await exists(client)
