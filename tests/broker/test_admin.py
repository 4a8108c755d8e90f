"""The admin REST API and the broker's HTTP endpoints, through the client and raw HTTP."""

from __future__ import annotations

import itertools
from typing import Any

import aiohttp
import pytest

from segtxn.broker.app import BrokerServer
from segtxn.client import Client, Consumer, ErrorName, Message, MessageId, ServerError
from tests.waiting import wait_until

TOPIC = "persistent://acme/admin/events"
SCALABLE = "topic://acme/admin/scaled"
SYSTEM_PROPERTY = "__contains_txn_messages"


async def produce(client: Client, topic: str, n: int, prefix: str = "m") -> list[MessageId]:
    producer = await client.create_producer(topic)
    ids = [await producer.send(f"{prefix}{i}".encode()) for i in range(n)]
    await producer.close()
    return ids


async def receive_n(consumer: Consumer, n: int) -> list[Message]:
    return [await consumer.receive(timeout_s=10) for _ in range(n)]


def position(message_id: MessageId) -> str:
    return f"{message_id.ledger_id}:{message_id.entry_id}"


async def backlog(client: Client, topic: str, subscription: str) -> int:
    stats = await client.admin.stats(topic)
    return int(stats["subscriptions"][subscription]["backlog"])


async def consumers_gone(client: Client, topic: str, subscription: str) -> None:
    async def none_left() -> bool:
        stats = await client.admin.stats(topic)
        return bool(stats["subscriptions"][subscription]["consumers"] == 0)

    await wait_until(none_left, timeout=5, what=f"no consumers on {subscription}")


async def raw(broker: BrokerServer, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
    """One HTTP request to the broker; returns (status, decoded JSON body or text)."""
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, broker.settings.advertise_url + path, **kwargs) as response,
    ):
        text = await response.text()
        if response.content_type == "application/json":
            return response.status, await response.json()
        return response.status, text


# ---------------------------------------------------------------------- topics


@pytest.mark.parametrize("topic", [TOPIC, SCALABLE])
async def test_creating_a_topic_twice_is_topic_already_exists(client: Client, topic: str) -> None:
    await client.admin.create_topic(topic, segments=2 if topic == SCALABLE else None)
    with pytest.raises(ServerError) as error:
        await client.admin.create_topic(topic, segments=2 if topic == SCALABLE else None)
    assert error.value.name is ErrorName.TOPIC_EXISTS


async def test_list_topics_by_domain_tenant_and_namespace(client: Client) -> None:
    for name in ("persistent://acme/admin/b", "persistent://acme/admin/a"):
        await client.admin.create_topic(name)
    await client.admin.create_topic("topic://acme/admin/c", segments=2)
    await client.admin.create_topic("persistent://acme/other/d")
    await client.admin.create_topic("persistent://other/admin/e")

    assert sorted(await client.admin.list_topics("persistent", "acme", "admin")) == [
        "persistent://acme/admin/a",
        "persistent://acme/admin/b",
    ]
    assert await client.admin.list_topics("topic", "acme", "admin") == ["topic://acme/admin/c"]
    assert await client.admin.list_topics("persistent", "acme", "nothing") == []


async def test_stats_of_a_persistent_topic(client: Client) -> None:
    await client.admin.create_topic(TOPIC)
    consumer = await client.subscribe(TOPIC, "sub", initial_position="earliest")
    producer = await client.create_producer(TOPIC, name="p1")
    payloads = [b"a", b"bb", b"ccc"]
    ids = [await producer.send(p) for p in payloads]
    got = await receive_n(consumer, 3)
    await consumer.acknowledge(got[0])

    stats = await client.admin.stats(TOPIC)
    assert stats["topic"] == TOPIC
    assert stats["msgInCounter"] == 3
    assert stats["bytesInCounter"] == sum(len(p) for p in payloads)
    assert stats["duplicatesDropped"] == 0
    assert stats["producers"] == 1
    assert stats["lastConfirmedPosition"] == position(ids[-1])
    assert stats["sealed"] is False
    assert stats["storage"]["entriesWritten"] == 3
    assert stats["subscriptions"] == {
        "sub": {
            "type": "Exclusive",
            "consumers": 1,
            "backlog": 2,
            "msgOutCounter": 3,
            "markDeletePosition": position(ids[0]),
        }
    }


async def test_stats_of_a_scalable_topic_show_each_segment(client: Client) -> None:
    await client.admin.create_topic(SCALABLE, segments=3)
    producer = await client.create_producer(SCALABLE)
    ids = [await producer.send(b"x", key=f"k{i}") for i in range(12)]

    stats = await client.admin.stats(SCALABLE)
    assert stats["topic"] == SCALABLE and stats["epoch"] == 0
    segments = stats["segments"]
    assert [s["id"] for s in segments] == [0, 1, 2]
    assert segments[0]["range"][0] == 0 and segments[-1]["range"][1] == 0xFFFF
    for left, right in itertools.pairwise(segments):
        assert right["range"][0] == left["range"][1] + 1  # the ranges tile the hash space
    assert all(s["state"] == "ACTIVE" for s in segments)
    for s in segments:
        assert s["stats"]["topic"] == f"segment://acme/admin/scaled/{s['id']}"
        assert s["stats"]["msgInCounter"] == sum(i.topic == s["stats"]["topic"] for i in ids)
    assert sum(s["stats"]["msgInCounter"] for s in segments) == 12


async def test_admin_calls_on_a_missing_topic_are_topic_not_found(client: Client) -> None:
    for call in (
        client.admin.stats(TOPIC),
        client.admin.stats(SCALABLE),
        client.admin.properties(SCALABLE),
        client.admin.update_properties(SCALABLE, {"a": "b"}),
        client.admin.delete_topic(SCALABLE),
    ):
        with pytest.raises(ServerError) as error:
            await call
        assert error.value.name is ErrorName.TOPIC_NOT_FOUND


# ---------------------------------------------------------------------- subscriptions


async def test_subscriptions_are_created_listed_reset_and_deleted(client: Client) -> None:
    await client.admin.create_topic(TOPIC)
    ids = await produce(client, TOPIC, 5)
    assert await client.admin.subscriptions(TOPIC) == []

    await client.admin.create_subscription(TOPIC, "from-start", initial_position="earliest")
    await client.admin.create_subscription(TOPIC, "from-now")  # latest by default
    assert await client.admin.subscriptions(TOPIC) == ["from-now", "from-start"]
    assert await backlog(client, TOPIC, "from-start") == 5
    assert await backlog(client, TOPIC, "from-now") == 0
    await client.admin.create_subscription(TOPIC, "from-now", initial_position="earliest")
    assert await backlog(client, TOPIC, "from-now") == 0  # creating again changes nothing

    await client.admin.reset_subscription(TOPIC, "from-start", to="latest")
    assert await backlog(client, TOPIC, "from-start") == 0
    await client.admin.reset_subscription(TOPIC, "from-start", to="earliest")
    assert await backlog(client, TOPIC, "from-start") == 5
    await client.admin.reset_subscription(TOPIC, "from-start", to=position(ids[3]))
    assert await backlog(client, TOPIC, "from-start") == 2

    consumer = await client.subscribe(TOPIC, "from-start")
    assert [m.message_id for m in await receive_n(consumer, 2)] == ids[3:]
    for call in (
        client.admin.reset_subscription(TOPIC, "from-start", to="earliest"),
        client.admin.delete_subscription(TOPIC, "from-start"),
    ):
        with pytest.raises(ServerError) as error:
            await call
        assert error.value.name is ErrorName.CONSUMER_BUSY
    await consumer.close()
    await consumers_gone(client, TOPIC, "from-start")

    await client.admin.delete_subscription(TOPIC, "from-start")
    assert await client.admin.subscriptions(TOPIC) == ["from-now"]
    assert "from-start" not in (await client.admin.stats(TOPIC))["subscriptions"]
    for call in (
        client.admin.delete_subscription(TOPIC, "from-start"),
        client.admin.reset_subscription(TOPIC, "unknown", to="earliest"),
    ):
        with pytest.raises(ServerError) as error:
            await call
        assert error.value.name is ErrorName.SUBSCRIPTION_NOT_FOUND


async def test_a_reset_subscription_redelivers_from_its_new_position(client: Client) -> None:
    await client.admin.create_topic(TOPIC)
    consumer = await client.subscribe(TOPIC, "sub", initial_position="earliest")
    ids = await produce(client, TOPIC, 4)
    for message in await receive_n(consumer, 4):
        await consumer.acknowledge(message)
    await consumer.close()
    await consumers_gone(client, TOPIC, "sub")
    assert await backlog(client, TOPIC, "sub") == 0

    await client.admin.reset_subscription(TOPIC, "sub", to=position(ids[1]))
    resumed = await client.subscribe(TOPIC, "sub")
    assert [m.message_id for m in await receive_n(resumed, 3)] == ids[1:]


async def test_bad_subscription_arguments_are_invalid_argument(client: Client) -> None:
    await client.admin.create_topic(TOPIC)
    await client.admin.create_subscription(TOPIC, "sub")
    for call in (
        client.admin.reset_subscription(TOPIC, "sub", to="yesterday"),
        client.admin.create_subscription(TOPIC, "other", initial_position="middle"),
        client.admin.create_subscription(TOPIC, "-bad-name"),
    ):
        with pytest.raises(ServerError) as error:
            await call
        assert error.value.name is ErrorName.INVALID_ARGUMENT
    assert await client.admin.subscriptions(TOPIC) == ["sub"]


async def test_a_subscription_name_cannot_name_another_subscription_in_the_url(
    client: Client,
) -> None:
    """A name with a ``?`` or a ``/`` is put into the request's path as one segment of it
    (the connector encodes it), so it never makes the URL of subscription ``s`` with the
    rest a query or another endpoint: refused, and ``s`` untouched."""
    await client.admin.create_topic(TOPIC)
    await client.admin.create_subscription(TOPIC, "s", initial_position="earliest")
    await produce(client, TOPIC, 2)
    for call in (
        client.admin.reset_subscription(TOPIC, "s?x", to="latest"),
        client.admin.delete_subscription(TOPIC, "s?x"),
        client.admin.delete_subscription(TOPIC, "s/"),
    ):
        with pytest.raises(ServerError):
            await call
    assert await client.admin.subscriptions(TOPIC) == ["s"]
    assert await backlog(client, TOPIC, "s") == 2


async def test_subscriptions_of_a_scalable_topic_span_its_segments(client: Client) -> None:
    await client.admin.create_topic(SCALABLE, segments=3)
    await client.admin.create_subscription(SCALABLE, "all", initial_position="earliest")
    assert await client.admin.subscriptions(SCALABLE) == ["all"]
    for segment in range(3):
        name = f"segment://acme/admin/scaled/{segment}"
        assert await client.admin.subscriptions(name) == ["all"]
    await client.admin.delete_subscription(SCALABLE, "all")
    assert await client.admin.subscriptions(SCALABLE) == []


async def test_a_scalable_topics_subscription_half_deleted_is_deleted_by_a_retry(
    client: Client,
) -> None:
    """A delete on a ``topic://`` goes segment by segment and stops at the first refusal
    (a consumer on a later segment, its broker down): the segments before had lost the
    subscription, and the retry, refused SubscriptionNotFound by the first of them, never
    reached the rest. Made here by deleting it from one segment first."""
    await client.admin.create_topic(SCALABLE, segments=3)
    await client.admin.create_subscription(SCALABLE, "all", initial_position="earliest")
    await client.admin.delete_subscription("segment://acme/admin/scaled/0", "all")
    await client.admin.delete_subscription(SCALABLE, "all")
    assert await client.admin.subscriptions(SCALABLE) == []
    with pytest.raises(ServerError) as error:  # on no segment at all: it is not found
        await client.admin.delete_subscription(SCALABLE, "all")
    assert error.value.name is ErrorName.SUBSCRIPTION_NOT_FOUND


# ---------------------------------------------------------------------- properties


async def user_properties(client: Client, topic: str) -> dict[str, str]:
    """The topic's properties less the system ones; a persistent topic has PIP-373's
    ``__contains_txn_messages``, ``false`` from its first load (nothing transactional yet)."""
    properties = await client.admin.properties(topic)
    if topic.startswith("persistent://"):
        assert properties.pop("__contains_txn_messages") == "false"
    return {k: v for k, v in properties.items() if not k.startswith("__")}


@pytest.mark.parametrize("topic", [TOPIC, SCALABLE])
async def test_properties_are_updated_read_and_removed(client: Client, topic: str) -> None:
    await client.admin.create_topic(topic, segments=2 if topic == SCALABLE else None)
    assert await user_properties(client, topic) == {}
    await client.admin.update_properties(topic, {"owner": "billing", "tier": "gold"})
    assert await user_properties(client, topic) == {"owner": "billing", "tier": "gold"}
    await client.admin.update_properties(topic, {"tier": "silver"})  # merged, not replaced
    assert await user_properties(client, topic) == {"owner": "billing", "tier": "silver"}
    await client.admin.remove_property(topic, "owner")
    assert await user_properties(client, topic) == {"tier": "silver"}


@pytest.mark.parametrize("topic", [TOPIC, SCALABLE])
async def test_system_properties_cannot_be_set_or_removed(client: Client, topic: str) -> None:
    await client.admin.create_topic(topic, segments=2 if topic == SCALABLE else None)
    await client.admin.update_properties(topic, {"kept": "yes"})
    for call in (
        client.admin.update_properties(topic, {SYSTEM_PROPERTY: "true"}),
        client.admin.update_properties(topic, {"other": "1", SYSTEM_PROPERTY: "false"}),
        client.admin.remove_property(topic, SYSTEM_PROPERTY),
    ):
        with pytest.raises(ServerError) as error:
            await call
        assert error.value.name is ErrorName.NOT_ALLOWED
    assert await user_properties(client, topic) == {"kept": "yes"}  # nothing half-applied


@pytest.mark.parametrize("topic", [TOPIC, SCALABLE])
async def test_a_properties_body_that_is_not_a_json_object_of_strings_is_refused(
    client: Client, broker: BrokerServer, topic: str
) -> None:
    await client.admin.create_topic(topic, segments=2 if topic == SCALABLE else None)
    path = "/admin/v2/" + topic.replace("://", "/", 1) + "/properties"
    for body in (b"not json", b'["a", "b"]', b'{"a": 1}', b"\xff\xfe"):
        status, answer = await raw(
            broker, "PUT", path, data=body, headers={"Content-Type": "application/json"}
        )
        assert status == 400, body
        assert answer["error"] == ErrorName.INVALID_ARGUMENT.value, body
    assert await user_properties(client, topic) == {}


# ---------------------------------------------------------------------- deleting topics


@pytest.mark.parametrize("topic", [TOPIC, SCALABLE])
async def test_a_deleted_topic_is_gone(client: Client, topic: str) -> None:
    await client.admin.create_topic(topic, segments=2 if topic == SCALABLE else None)
    await produce(client, topic, 3)
    await client.admin.delete_topic(topic)

    with pytest.raises(ServerError) as error:
        await client.create_producer(topic)
    assert error.value.name is ErrorName.TOPIC_NOT_FOUND
    with pytest.raises(ServerError) as error:
        await client.admin.stats(topic)
    assert error.value.name is ErrorName.TOPIC_NOT_FOUND
    domain = topic.split(":", 1)[0]
    assert await client.admin.list_topics(domain, "acme", "admin") == []

    await client.admin.create_topic(topic, segments=2 if topic == SCALABLE else None)
    consumer = await client.subscribe(topic, "fresh", initial_position="earliest")
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout_s=0.3)  # bounded absence check: the old data is gone


async def test_deleting_a_topic_with_connected_clients_needs_force(client: Client) -> None:
    await client.admin.create_topic(TOPIC)
    consumer = await client.subscribe(TOPIC, "sub")
    with pytest.raises(ServerError) as error:
        await client.admin.delete_topic(TOPIC)
    assert error.value.name is ErrorName.CONSUMER_BUSY
    await consumer.close()
    await consumers_gone(client, TOPIC, "sub")

    producer = await client.create_producer(TOPIC)
    await producer.send(b"before")
    with pytest.raises(ServerError) as error:
        await client.admin.delete_topic(TOPIC)
    assert error.value.name is ErrorName.CONSUMER_BUSY
    await producer.send(b"still there")
    stats = await client.admin.stats(TOPIC)
    assert stats["msgInCounter"] == 2 and list(stats["subscriptions"]) == ["sub"]

    await client.admin.delete_topic(TOPIC, force=True)
    with pytest.raises(ServerError) as error:
        await client.create_producer(TOPIC)
    assert error.value.name is ErrorName.TOPIC_NOT_FOUND
    assert await client.admin.list_topics("persistent", "acme", "admin") == []


async def test_a_forced_delete_tells_connected_consumers_the_topic_is_gone(
    client: Client,
) -> None:
    await client.admin.create_topic(TOPIC)
    consumer = await client.subscribe(TOPIC, "sub")
    await client.admin.delete_topic(TOPIC, force=True)
    with pytest.raises(ServerError) as error:
        await consumer.receive(timeout_s=2)  # today: TimeoutError, it waits forever
    assert error.value.name is ErrorName.TOPIC_NOT_FOUND


async def test_a_forced_delete_tells_connected_producers_the_topic_is_gone(
    client: Client,
) -> None:
    await client.admin.create_topic(TOPIC)
    producer = await client.create_producer(TOPIC)
    await producer.send(b"before")
    await client.admin.delete_topic(TOPIC, force=True)
    with pytest.raises(ServerError) as error:
        await producer.send(b"after")
    assert error.value.name is ErrorName.TOPIC_NOT_FOUND


async def test_a_refused_delete_of_a_scalable_topic_deletes_nothing(client: Client) -> None:
    await client.admin.create_topic(SCALABLE, segments=3)
    ids = await produce(client, SCALABLE, 12)  # unkeyed: round-robin over every segment
    assert len({i.topic for i in ids}) == 3
    last_segment = await client.create_producer("segment://acme/admin/scaled/2")
    await last_segment.send(b"busy")

    with pytest.raises(ServerError) as error:
        await client.admin.delete_topic(SCALABLE)
    assert error.value.name is ErrorName.CONSUMER_BUSY

    stats = await client.admin.stats(SCALABLE)
    assert [s["stats"]["lastConfirmedPosition"] is not None for s in stats["segments"]] == [
        True,
        True,
        True,
    ]
    consumer = await client.subscribe(SCALABLE, "audit", initial_position="earliest")
    got = await receive_n(consumer, 13)
    assert {m.message_id for m in got} >= set(ids)


# ---------------------------------------------------------------------- names


@pytest.mark.parametrize("name", ["persistent://acme/admin", "kafka://acme/admin/x"])
async def test_invalid_topic_names_are_invalid_topic_name_errors(client: Client, name: str) -> None:
    with pytest.raises(ServerError) as error:
        await client.admin.create_topic(name)
    assert error.value.name is ErrorName.INVALID_TOPIC_NAME


@pytest.mark.parametrize("name", ["persistent://acme/admin", "kafka://acme/admin/x"])
async def test_invalid_topic_names_are_refused_by_producers_and_consumers(
    client: Client, name: str
) -> None:
    with pytest.raises(ServerError) as error:
        await client.create_producer(name)
    assert error.value.name is ErrorName.INVALID_TOPIC_NAME
    with pytest.raises(ServerError) as error:
        await client.subscribe(name, "sub")
    assert error.value.name is ErrorName.INVALID_TOPIC_NAME


@pytest.mark.parametrize(
    ("method", "suffix"),
    [("PUT", ""), ("GET", "/stats"), ("GET", "/properties"), ("DELETE", "")],
)
@pytest.mark.parametrize("local", ["-leading-dash", "x" * 129, "sp%20ace"])
async def test_the_broker_refuses_invalid_topic_names(
    broker: BrokerServer, method: str, suffix: str, local: str
) -> None:
    status, answer = await raw(broker, method, f"/admin/v2/persistent/acme/admin/{local}{suffix}")
    assert status == 400
    assert answer["error"] == ErrorName.INVALID_TOPIC_NAME.value


# ------------------------------------------------------ health (metrics: test_metrics.py)


async def test_health_and_readiness(broker: BrokerServer) -> None:
    assert await raw(broker, "GET", "/healthz") == (200, {"status": "ok"})
    assert await raw(broker, "GET", "/readyz") == (200, {"ready": True})


async def test_a_broker_s_homes_list_what_removing_it_would_strand(
    client: Client, broker: BrokerServer
) -> None:
    """The operator's scale-down guard asks this: every topic and segment whose data is on
    the broker's disk, bounded, and nothing for a broker that holds nothing."""
    me = broker.settings.broker_id
    assert (await client.admin.broker_homes(me)).empty
    await client.admin.create_topic("persistent://acme/homes/p")
    await client.admin.create_topic("topic://acme/homes/s", segments=2)
    held = await client.admin.broker_homes(me)
    assert sorted(held.homes) == [
        "persistent://acme/homes/p",
        "segment://acme/homes/s/0",
        "segment://acme/homes/s/1",
    ]
    assert not held.more and not held.empty
    first = await client.admin.broker_homes(me, limit=2)
    assert len(first.homes) == 2 and first.more and not first.empty
    never = await client.admin.broker_homes("never-started-7")  # any id, alive or not
    assert never.empty and not never.registered
    assert held.registered
    for bad_id, limit in (("-x", 1), ("a" * 64, 1), (me, 0), (me, 1001)):
        with pytest.raises(ServerError) as refused:
            await client.admin.broker_homes(bad_id, limit=limit)
        assert refused.value.name is ErrorName.INVALID_ARGUMENT
    # The namespace listing of the same shape still answers.
    assert await client.admin.list_topics("persistent", "acme", "homes") == [
        "persistent://acme/homes/p"
    ]
    await client.admin.delete_topic("topic://acme/homes/s")
    await client.admin.delete_topic("persistent://acme/homes/p")
    assert (await client.admin.broker_homes(me)).empty


async def test_draining_a_broker_that_is_not_registered_is_the_caller_s_mistake(
    client: Client, broker: BrokerServer
) -> None:
    """A typo'd or gone broker id is answered 404 ``InvalidArgument`` (as an unknown path
    is) at once, naming the id and the brokers that are registered; it was a 503
    ServiceNotReady, which the client (and the operator through it) retried for the whole
    drain timeout as if the broker would come.

    An undrain gets the same answer, and says what it means for the broker: one that is not
    registered has no drain to stop here (placement skips it anyway; gone, it starts
    undrained; running with its registration lost, it comes back draining). It said only
    that the broker was not registered, which read as if the undrain had failed and the
    broker would stay drained."""
    me = broker.settings.broker_id
    expected = f"no broker nobody-7 is registered (registered: {me})"
    undrained = (
        f"{expected}: not registered now, so there is no drain of it to stop here (a broker "
        "that is gone starts undrained; one still running that lost its registration "
        "registers again still draining: undrain it once it is back)"
    )
    for method, message in (("POST", expected), ("DELETE", undrained)):
        status, body = await raw(broker, method, "/admin/v2/brokers/nobody-7/drain")
        assert (status, body) == (404, {"error": "InvalidArgument", "message": message})
    with pytest.raises(ServerError) as refused:
        await client.admin.drain_broker("nobody-7", timeout_s=30)
    assert refused.value.name is ErrorName.INVALID_ARGUMENT
    assert refused.value.message == expected
    with pytest.raises(ServerError) as refused:
        await client.admin.undrain_broker("nobody-7")
    assert refused.value.name is ErrorName.INVALID_ARGUMENT
    assert refused.value.message == undrained
