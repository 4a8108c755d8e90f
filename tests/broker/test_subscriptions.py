"""Subscriptions through a real broker: types, acks, redelivery, flow control, readers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from segtxn.broker.app import BrokerServer
from segtxn.client import Client, Consumer, ErrorName, Message, MessageId, ServerError
from segtxn.protocol.names import TopicName
from tests.waiting import wait_until

TOPIC = "persistent://acme/subs/events"


async def produce(client: Client, topic: str, n: int, prefix: str = "m") -> list[MessageId]:
    producer = await client.create_producer(topic)
    ids = [await producer.send(f"{prefix}{i}".encode()) for i in range(n)]
    await producer.close()
    return ids


async def receive_n(consumer: Consumer, n: int, *, timeout_s: float = 10) -> list[Message]:
    return [await consumer.receive(timeout_s=timeout_s) for _ in range(n)]


async def receive_across(
    consumers: Sequence[Consumer], n: int, *, timeout_s: float = 10
) -> list[list[Message]]:
    """``n`` messages in total from several consumers at once, as each one got them."""
    got: list[list[Message]] = [[] for _ in consumers]
    enough = asyncio.Event()

    async def pump(mine: list[Message], consumer: Consumer) -> None:
        while True:
            mine.append(await consumer.receive())
            if sum(len(g) for g in got) >= n:
                enough.set()

    tasks = [asyncio.create_task(pump(g, c)) for g, c in zip(got, consumers, strict=True)]
    try:
        async with asyncio.timeout(timeout_s):
            await enough.wait()
    except TimeoutError:
        raise AssertionError(f"got {[len(g) for g in got]} of {n} messages") from None
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return got


async def sub_stats(client: Client, topic: str, subscription: str) -> dict[str, object]:
    stats = await client.admin.stats(topic)
    return dict(stats["subscriptions"][subscription])


async def consumers_gone(client: Client, topic: str, subscription: str) -> None:
    """Wait until the broker has let go of every consumer of ``subscription``."""

    async def none_left() -> bool:
        return (await sub_stats(client, topic, subscription))["consumers"] == 0

    await wait_until(none_left, timeout=5, what=f"no consumers on {subscription}")


async def assert_nothing_more(*consumers: Consumer) -> None:
    for consumer in consumers:
        with pytest.raises(TimeoutError):
            await consumer.receive(timeout_s=0.3)  # bounded absence check


def values(messages: Sequence[Message]) -> list[bytes]:
    return [m.value for m in messages]


# ---------------------------------------------------------------------- Exclusive


async def test_exclusive_refuses_a_second_consumer_then_hands_unacked_to_the_next(
    client: Client,
) -> None:
    await client.admin.create_topic(TOPIC)
    first = await client.subscribe(TOPIC, "ex", subscription_type="Exclusive", name="first")
    ids = await produce(client, TOPIC, 5)
    got = await receive_n(first, 5)
    assert [m.message_id for m in got] == ids
    for message in got[:2]:
        await first.acknowledge(message)

    for sub_type in ("Exclusive", "Failover", "Shared"):
        with pytest.raises(ServerError) as error:
            await client.subscribe(TOPIC, "ex", subscription_type=sub_type, name="second")
        assert error.value.name is ErrorName.CONSUMER_BUSY, sub_type
    stats = await sub_stats(client, TOPIC, "ex")
    assert stats["consumers"] == 1 and stats["type"] == "Exclusive"
    assert stats["backlog"] == 3

    await first.close()
    await consumers_gone(client, TOPIC, "ex")
    third = await client.subscribe(TOPIC, "ex", subscription_type="Exclusive", name="third")
    again = await receive_n(third, 3)
    assert [m.message_id for m in again] == ids[2:]
    assert all(m.redelivery_count >= 1 for m in again)
    await assert_nothing_more(third)


# ---------------------------------------------------------------------- Failover


async def test_failover_only_the_active_consumer_receives_and_a_standby_takes_over(
    client: Client,
) -> None:
    await client.admin.create_topic(TOPIC)
    active = await client.subscribe(TOPIC, "fo", subscription_type="Failover", name="c1")
    standby = await client.subscribe(TOPIC, "fo", subscription_type="Failover", name="c2")
    assert active.active and not standby.active
    ids = await produce(client, TOPIC, 10)

    got = await receive_n(active, 10)
    assert [m.message_id for m in got] == ids
    for message in got[:4]:
        await active.acknowledge(message)
    await assert_nothing_more(standby)
    assert (await sub_stats(client, TOPIC, "fo"))["consumers"] == 2

    await active.close()
    await wait_until(lambda: standby.active, timeout=5, what="the standby to become active")
    taken_over = await receive_n(standby, 6)
    assert [m.message_id for m in taken_over] == ids[4:]  # in order, none lost
    assert all(m.redelivery_count >= 1 for m in taken_over)
    for message in taken_over:
        await standby.acknowledge(message)

    later = await produce(client, TOPIC, 3, prefix="later")
    fresh = await receive_n(standby, 3)
    assert [m.message_id for m in fresh] == later
    assert [m.redelivery_count for m in fresh] == [0, 0, 0]
    for message in fresh:
        await standby.acknowledge(message)
    await assert_nothing_more(standby)
    assert (await sub_stats(client, TOPIC, "fo"))["backlog"] == 0


async def test_a_failover_member_that_loses_its_turn_drops_what_it_had_queued(
    client: Client,
) -> None:
    """c2 holds queued, untaken messages when c1 (first by name) joins and becomes active: c2
    must not hand them to its application, since the broker gives them to c1."""
    await client.admin.create_topic(TOPIC)
    first = await client.subscribe(TOPIC, "fo", subscription_type="Failover", name="c2")
    ids = await produce(client, TOPIC, 10)
    head = await first.receive(timeout_s=10)  # the rest wait in its local queue
    assert head.message_id == ids[0]
    second = await client.subscribe(TOPIC, "fo", subscription_type="Failover", name="c1")
    await wait_until(lambda: not first.active, timeout=5, what="c2 to stand by")
    got = await receive_n(second, 10)
    assert [m.message_id for m in got] == ids  # the one c2 took too: it never acked it
    await assert_nothing_more(first)
    for message in got:
        await second.acknowledge(message)
    assert (await sub_stats(client, TOPIC, "fo"))["backlog"] == 0


# ---------------------------------------------------------------------- Shared


async def test_shared_consumers_split_the_messages_each_delivered_once(client: Client) -> None:
    await client.admin.create_topic(TOPIC)
    one = await client.subscribe(TOPIC, "sh", subscription_type="Shared", name="one")
    two = await client.subscribe(TOPIC, "sh", subscription_type="Shared", name="two")
    ids = await produce(client, TOPIC, 20)

    got_one, got_two = await receive_across([one, two], 20)
    assert got_one and got_two, "both consumers get some"
    everything = got_one + got_two
    assert sorted(m.message_id for m in everything) == ids  # each exactly once
    assert all(m.redelivery_count == 0 for m in everything)
    for consumer, messages in ((one, got_one), (two, got_two)):
        for message in messages:
            await consumer.acknowledge(message)
    await assert_nothing_more(one, two)
    stats = await sub_stats(client, TOPIC, "sh")
    assert stats["backlog"] == 0 and stats["msgOutCounter"] == 20 and stats["type"] == "Shared"


async def test_cumulative_ack_on_shared_is_not_allowed(client: Client) -> None:
    await client.admin.create_topic(TOPIC)
    consumer = await client.subscribe(TOPIC, "sh", subscription_type="Shared")
    await produce(client, TOPIC, 2)
    first, second = await receive_n(consumer, 2)
    with pytest.raises(ServerError) as error:
        await consumer.acknowledge_cumulative(second)
    assert error.value.name is ErrorName.NOT_ALLOWED
    assert (await sub_stats(client, TOPIC, "sh"))["backlog"] == 2  # nothing was acked
    await consumer.acknowledge(first)
    assert (await sub_stats(client, TOPIC, "sh"))["backlog"] == 1


async def test_cumulative_ack_on_exclusive_acks_everything_up_to_it(client: Client) -> None:
    await client.admin.create_topic(TOPIC)
    consumer = await client.subscribe(TOPIC, "ex", subscription_type="Exclusive")
    ids = await produce(client, TOPIC, 5)
    got = await receive_n(consumer, 5)
    await consumer.acknowledge_cumulative(got[2])
    stats = await sub_stats(client, TOPIC, "ex")
    assert stats["backlog"] == 2
    assert stats["markDeletePosition"] == f"{ids[2].ledger_id}:{ids[2].entry_id}"


# ---------------------------------------------------------------------- redelivery


async def test_a_negative_ack_on_an_ordered_subscription_rewinds_to_it(
    client: Client,
) -> None:
    """What was queued after the nacked message is dropped and comes again behind it: the
    application never gets an older message after a newer one."""
    await client.admin.create_topic(TOPIC)
    consumer = await client.subscribe(TOPIC, "nack", subscription_type="Exclusive")
    ids = await produce(client, TOPIC, 3)
    first = await consumer.receive(timeout_s=5)
    assert first.message_id == ids[0] and first.redelivery_count == 0
    await consumer.negative_acknowledge(first)

    again = await receive_n(consumer, 3)
    assert [m.message_id for m in again] == ids
    assert again[0].value == b"m0" and again[0].redelivery_count == 1
    assert again[0].epoch > first.epoch

    for message in again:
        await consumer.acknowledge(message)
    await assert_nothing_more(consumer)
    assert (await sub_stats(client, TOPIC, "nack"))["backlog"] == 0


async def test_a_negative_ack_on_a_shared_subscription_redelivers_only_it(
    client: Client,
) -> None:
    await client.admin.create_topic(TOPIC)
    consumer = await client.subscribe(TOPIC, "nack", subscription_type="Shared")
    ids = await produce(client, TOPIC, 3)
    first = await consumer.receive(timeout_s=5)
    assert first.message_id == ids[0]
    await consumer.negative_acknowledge(first)
    rest = await receive_n(consumer, 2)
    assert [m.message_id for m in rest] == ids[1:]
    again = await consumer.receive(timeout_s=5)
    assert again.message_id == ids[0] and again.redelivery_count == 1
    for message in (again, *rest):
        await consumer.acknowledge(message)
    await assert_nothing_more(consumer)


async def test_the_redelivery_count_grows_with_each_negative_ack(client: Client) -> None:
    await client.admin.create_topic(TOPIC)
    consumer = await client.subscribe(TOPIC, "nack", subscription_type="Exclusive")
    (only,) = await produce(client, TOPIC, 1)
    counts = []
    for _ in range(3):
        message = await consumer.receive(timeout_s=5)
        assert message.message_id == only
        counts.append(message.redelivery_count)
        await consumer.negative_acknowledge(message)
    assert counts == [0, 1, 2]


async def test_unacked_messages_of_a_closed_consumer_go_to_another(client: Client) -> None:
    await client.admin.create_topic(TOPIC)
    leaving = await client.subscribe(TOPIC, "sh", subscription_type="Shared", name="leaving")
    ids = await produce(client, TOPIC, 6)
    got = await receive_n(leaving, 6)
    for message in got[:2]:
        await leaving.acknowledge(message)

    staying = await client.subscribe(TOPIC, "sh", subscription_type="Shared", name="staying")
    await assert_nothing_more(staying)  # all six are pending on `leaving`: none twice

    await leaving.close()
    redelivered = await receive_n(staying, 4)
    assert sorted(m.message_id for m in redelivered) == ids[2:]
    assert all(m.redelivery_count >= 1 for m in redelivered)
    for message in redelivered:
        await staying.acknowledge(message)
    await assert_nothing_more(staying)
    assert (await sub_stats(client, TOPIC, "sh"))["backlog"] == 0


# ---------------------------------------------------------------------- durability


async def test_acks_hold_when_the_subscription_is_resumed(client: Client) -> None:
    await client.admin.create_topic(TOPIC)
    consumer = await client.subscribe(TOPIC, "durable", initial_position="earliest")
    ids = await produce(client, TOPIC, 10)
    got = await receive_n(consumer, 10)
    for message in got[::2]:  # individual acks, with gaps
        await consumer.acknowledge(message)
    await consumer.close()
    await consumers_gone(client, TOPIC, "durable")
    assert (await sub_stats(client, TOPIC, "durable"))["backlog"] == 5

    resumed = await client.subscribe(TOPIC, "durable", initial_position="earliest")
    again = await receive_n(resumed, 5)
    assert [m.message_id for m in again] == ids[1::2]
    await assert_nothing_more(resumed)
    for message in again:
        await resumed.acknowledge(message)
    assert (await sub_stats(client, TOPIC, "durable"))["backlog"] == 0


async def test_acks_survive_the_topic_being_unloaded_and_loaded_again(
    client: Client, broker: BrokerServer
) -> None:
    await client.admin.create_topic(TOPIC)
    consumer = await client.subscribe(TOPIC, "durable", initial_position="earliest")
    ids = await produce(client, TOPIC, 10)
    got = await receive_n(consumer, 10)
    for message in [*got[:3], got[5], got[8]]:
        await consumer.acknowledge(message)
    await consumer.close()
    await consumers_gone(client, TOPIC, "durable")

    await broker.service.unload(TopicName.parse(TOPIC))  # state comes back from the store
    stats = await sub_stats(client, TOPIC, "durable")
    assert stats["backlog"] == 5
    assert stats["markDeletePosition"] == f"{ids[2].ledger_id}:{ids[2].entry_id}"

    resumed = await client.subscribe(TOPIC, "durable")
    again = await receive_n(resumed, 5)
    assert [m.message_id for m in again] == [ids[i] for i in (3, 4, 6, 7, 9)]
    await assert_nothing_more(resumed)


# ---------------------------------------------------------------------- flow control


async def test_a_small_receiver_queue_still_gets_everything(client: Client) -> None:
    await client.admin.create_topic(TOPIC)
    consumer = await client.subscribe(
        TOPIC, "flow", initial_position="earliest", receiver_queue_size=5
    )
    ids = await produce(client, TOPIC, 50)

    async def sent() -> int:
        out = (await sub_stats(client, TOPIC, "flow"))["msgOutCounter"]
        assert isinstance(out, int)
        return out

    async def five_sent() -> bool:
        return await sent() >= 5

    await wait_until(five_sent, timeout=5, what="the first permits to be used")
    assert await sent() == 5  # no more than the permits granted

    got: list[Message] = []
    for _ in range(50):
        message = await consumer.receive(timeout_s=5)
        got.append(message)
        await consumer.acknowledge(message)
        assert await sent() - len(got) <= 5, "more in flight than the receiver queue holds"
    assert [m.message_id for m in got] == ids
    await assert_nothing_more(consumer)
    assert (await sub_stats(client, TOPIC, "flow"))["backlog"] == 0


# ---------------------------------------------------------------------- readers


async def test_readers_start_at_earliest_or_at_a_message_id(client: Client) -> None:
    await client.admin.create_topic(TOPIC)
    ids = await produce(client, TOPIC, 10)

    from_start = await client.create_reader(TOPIC, start="earliest")
    got = [await from_start.receive(timeout_s=5) for _ in range(10)]
    assert [m.message_id for m in got] == ids
    assert values(got) == [f"m{i}".encode() for i in range(10)]

    middle = ids[6]
    from_middle = await client.create_reader(TOPIC, start=f"{middle.ledger_id}:{middle.entry_id}")
    tail = [await from_middle.receive(timeout_s=5) for _ in range(4)]
    assert [m.message_id for m in tail] == ids[6:]

    later = await produce(client, TOPIC, 2, prefix="later")  # readers follow the tail
    assert [(await from_start.receive(timeout_s=5)).message_id for _ in range(2)] == later
    assert [(await from_middle.receive(timeout_s=5)).message_id for _ in range(2)] == later
    assert await client.admin.subscriptions(TOPIC) == []  # readers leave no cursor


async def test_initial_position_decides_what_a_new_subscription_sees(client: Client) -> None:
    await client.admin.create_topic(TOPIC)
    before = await produce(client, TOPIC, 3, prefix="before")
    late = await client.subscribe(TOPIC, "late", initial_position="latest")
    early = await client.subscribe(TOPIC, "early", initial_position="earliest")
    after = await produce(client, TOPIC, 2, prefix="after")

    assert [m.message_id for m in await receive_n(late, 2)] == after
    assert [m.message_id for m in await receive_n(early, 5)] == before + after
    await assert_nothing_more(late, early)
    assert (await sub_stats(client, TOPIC, "late"))["backlog"] == 2
    assert (await sub_stats(client, TOPIC, "early"))["backlog"] == 5


# ---------------------------------------------------------------------- scalable topics


async def test_a_subscription_on_a_scalable_topic_gets_every_segment_once(
    client: Client,
) -> None:
    topic = "topic://acme/subs/scaled"
    await client.admin.create_topic(topic, segments=3)
    consumer = await client.subscribe(topic, "all", initial_position="earliest")
    producer = await client.create_producer(topic)
    ids = [await producer.send(f"v{i}".encode(), key=f"key-{i}") for i in range(30)]
    ids += [await producer.send(f"unkeyed{i}".encode()) for i in range(3)]
    assert {i.topic for i in ids} == {f"segment://acme/subs/scaled/{s}" for s in range(3)}

    got = await receive_n(consumer, len(ids))
    assert sorted(m.message_id for m in got) == sorted(ids)  # each exactly once
    for message in got:
        await consumer.acknowledge(message)
    await assert_nothing_more(consumer)
    stats = await client.admin.stats(topic)
    backlogs = [s["stats"]["subscriptions"]["all"]["backlog"] for s in stats["segments"]]
    assert backlogs == [0, 0, 0]
