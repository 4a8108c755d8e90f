"""``segtxn topics reset-subscription`` and ``delete-subscription`` against a real
``segtxn standalone`` process: a reset moves where the next consumer receives from, a
deletion removes the subscription from the topic's stats, on ``persistent://`` and
``topic://`` alike; a subscription in use, an unknown topic or subscription and a position
past the end are one line and exit status 1; a malformed argument is a usage error (2)
before anything connects. ``repair-cursor``'s advice for a cursor that reads names the
reset (its repair itself is tested in tests/broker/test_cursor_repair.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from segtxn.client import Client
from tests.cli.test_cli_errors import invoke, one_line
from tests.waiting import wait_until

RESET = ("topics", "reset-subscription")
DELETE = ("topics", "delete-subscription")


def _subscriptions(stats: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each subscription's stats (a ``topic://``'s: merged over its segments, the
    consumers summed)."""
    if "segments" not in stats:
        return dict(stats["subscriptions"])
    merged: dict[str, dict[str, Any]] = {}
    for segment in stats["segments"]:
        for name, sub in (segment["stats"] or {"subscriptions": {}})["subscriptions"].items():
            merged.setdefault(name, {"consumers": 0})["consumers"] += sub["consumers"]
    return merged


def _listed(url: str, topic: str) -> dict[str, dict[str, Any]]:
    result = invoke("topics", "stats", topic, "-o", "json", "--url", url)
    assert result.exit_code == 0, result.output
    return _subscriptions(json.loads(result.stdout))


async def _idle(client: Client, topic: str, subscription: str) -> None:
    """Wait until the broker has let the closed consumers of ``subscription`` go."""

    async def idle() -> bool:
        found = _subscriptions(await client.admin.stats(topic))
        consumers: int = found[subscription]["consumers"]
        return consumers == 0

    await wait_until(idle, what=f"{subscription} on {topic} without consumers")


async def _first(client: Client, topic: str, subscription: str) -> bytes:
    """The value of the first message a new consumer of ``subscription`` receives (the
    consumer closed again, and let go by the broker)."""
    consumer = await client.subscribe(topic, subscription)
    try:
        return (await consumer.receive(timeout_s=10)).value
    finally:
        await consumer.close()
        await _idle(client, topic, subscription)


async def _consume_all(client: Client, topic: str, subscription: str, n: int) -> set[bytes]:
    """Receive and acknowledge ``n`` messages from the earliest (the consumer closed)."""
    consumer = await client.subscribe(topic, subscription, initial_position="earliest")
    values = set()
    try:
        for _ in range(n):
            message = await consumer.receive(timeout_s=10)
            await consumer.acknowledge(message)
            values.add(message.value)
    finally:
        await consumer.close()
        await _idle(client, topic, subscription)
    return values


async def _cli(*args: str) -> Any:
    return await asyncio.to_thread(invoke, *args)


def test_a_reset_moves_a_persistent_subscription(standalone: str) -> None:
    topic = "persistent://t/ns/reset"
    assert invoke("topics", "create", topic, "--url", standalone).exit_code == 0

    async def scenario() -> None:
        async with Client(standalone) as client:
            producer = await client.create_producer(topic)
            ids = [await producer.send(f"m{i}".encode()) for i in range(5)]
            assert await _consume_all(client, topic, "s", 5) == {f"m{i}".encode() for i in range(5)}

            back = await _cli(*RESET, topic, "s", "--to-earliest", "--url", standalone)
            assert back.exit_code == 0, back.output
            assert back.stdout == f"reset s on {topic} to earliest\n"
            assert await _first(client, topic, "s") == b"m0"

            position = f"{ids[3].ledger_id}:{ids[3].entry_id}"
            to_3 = await _cli(*RESET, topic, "s", "--to", position, "--url", standalone)
            assert to_3.exit_code == 0, to_3.output
            assert to_3.stdout == f"reset s on {topic} to {position}\n"
            assert await _first(client, topic, "s") == b"m3"

            latest = await _cli(*RESET, topic, "s", "--to-latest", "--url", standalone)
            assert latest.exit_code == 0, latest.output
            await producer.send(b"new")
            assert await _first(client, topic, "s") == b"new"

            beyond = f"{ids[-1].ledger_id}:{ids[-1].entry_id + 100}"
            past = await _cli(*RESET, topic, "s", "--to", beyond, "--url", standalone)
            assert past.exit_code == 1
            assert one_line(past).startswith(f"Error: InvalidArgument: to={beyond} is beyond")

    asyncio.run(scenario())


def test_a_reset_moves_a_scalable_topics_subscription_on_every_segment(standalone: str) -> None:
    topic = "topic://t/ns/reset-scalable"
    created = invoke("topics", "create", topic, "--segments", "2", "--url", standalone)
    assert created.exit_code == 0, created.output
    sent = {f"m{i}".encode() for i in range(8)}

    async def scenario() -> None:
        async with Client(standalone) as client:
            producer = await client.create_producer(topic)
            for i, value in enumerate(sorted(sent)):
                await producer.send(value, key=f"k{i}")
            assert await _consume_all(client, topic, "s", len(sent)) == sent

            back = await _cli(*RESET, topic, "s", "--to-earliest", "--url", standalone)
            assert back.exit_code == 0, back.output
            assert await _consume_all(client, topic, "s", len(sent)) == sent  # all again

            latest = await _cli(*RESET, topic, "s", "--to-latest", "--url", standalone)
            assert latest.exit_code == 0, latest.output
            await producer.send(b"new", key="k0")
            assert await _first(client, topic, "s") == b"new"

    asyncio.run(scenario())
    # a position names one segment's entry: the API takes none for a topic://
    position = invoke(*RESET, topic, "s", "--to", "1:0", "--url", standalone)
    assert position.exit_code == 2
    assert "--to does not apply here" in one_line(position)
    assert "segment://" in one_line(position)


def test_a_segment_of_a_scalable_topic_is_reset_to_a_position(standalone: str) -> None:
    """What ``--to`` on a ``topic://`` is refused for: a message id names a segment's entry,
    and that segment is reset to it (the usage error says so)."""
    topic = "topic://t/ns/reset-segment"
    assert invoke("topics", "create", topic, "--url", standalone).exit_code == 0

    async def scenario() -> None:
        async with Client(standalone) as client:
            producer = await client.create_producer(topic)
            ids = [await producer.send(f"m{i}".encode()) for i in range(4)]
            assert await _consume_all(client, topic, "s", 4) == {f"m{i}".encode() for i in range(4)}
            segment = ids[2].topic
            assert segment == "segment://t/ns/reset-segment/0"
            position = f"{ids[2].ledger_id}:{ids[2].entry_id}"
            moved = await _cli(*RESET, segment, "s", "--to", position, "--url", standalone)
            assert moved.exit_code == 0, moved.output
            assert await _first(client, topic, "s") == b"m2"

    asyncio.run(scenario())


@pytest.mark.parametrize("topic", ["persistent://t/ns/deleted", "topic://t/ns/deleted"])
def test_a_deleted_subscription_is_gone_from_the_stats(standalone: str, topic: str) -> None:
    assert invoke("topics", "create", topic, "--url", standalone).exit_code == 0

    async def subscribe() -> None:
        async with Client(standalone) as client:
            await client.admin.create_subscription(topic, "gone")
            await client.admin.create_subscription(topic, "kept")

    asyncio.run(subscribe())
    assert set(_listed(standalone, topic)) == {"gone", "kept"}
    deleted = invoke(*DELETE, topic, "gone", "--url", standalone)
    assert deleted.exit_code == 0, deleted.output
    assert deleted.stdout == f"deleted subscription gone of {topic}\n"
    assert set(_listed(standalone, topic)) == {"kept"}

    again = invoke(*DELETE, topic, "gone", "--url", standalone)
    assert again.exit_code == 1
    assert one_line(again).startswith("Error: SubscriptionNotFound: ")


@pytest.mark.parametrize("topic", ["persistent://t/ns/busy", "topic://t/ns/busy"])
def test_a_subscription_in_use_is_neither_reset_nor_deleted(standalone: str, topic: str) -> None:
    assert invoke("topics", "create", topic, "--url", standalone).exit_code == 0

    async def while_consumed() -> tuple[Any, Any]:
        async with Client(standalone) as client:
            consumer = await client.subscribe(topic, "busy")
            reset = await _cli(*RESET, topic, "busy", "--to-earliest", "--url", standalone)
            deleted = await _cli(*DELETE, topic, "busy", "--url", standalone)
            await consumer.close()
            return reset, deleted

    reset, deleted = asyncio.run(while_consumed())
    for result, verb in ((reset, "reset"), (deleted, "deleted")):
        assert result.exit_code == 1
        assert one_line(result) == (
            f"Error: subscription busy of {topic} has connected consumers: it cannot be "
            f"{verb} while they are (close them, then run this again)"
        )
    assert "busy" in _listed(standalone, topic)


@pytest.mark.parametrize("topic", ["persistent://t/ns/unknowns", "topic://t/ns/unknowns"])
def test_an_unknown_topic_or_subscription_is_one_line(standalone: str, topic: str) -> None:
    missing = topic.replace("unknowns", "missing")
    for command in ((*RESET, missing, "s", "--to-earliest"), (*DELETE, missing, "s")):
        result = invoke(*command, "--url", standalone)
        assert result.exit_code == 1
        assert one_line(result).startswith("Error: TopicNotFound: ")
    assert invoke("topics", "create", topic, "--url", standalone).exit_code == 0
    for command in ((*RESET, topic, "nobody", "--to-latest"), (*DELETE, topic, "nobody")):
        result = invoke(*command, "--url", standalone)
        assert result.exit_code == 1
        assert one_line(result).startswith("Error: SubscriptionNotFound: ")
        assert "'nobody'" in one_line(result)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("s",), "give one of --to-earliest, --to-latest or --to LEDGER:ENTRY"),
        (("s", "--to-earliest", "--to-latest"), "give one of --to-earliest, --to-latest"),
        (("s", "--to-latest", "--to", "1:2"), "give one of --to-earliest, --to-latest"),
        (("s", "--to", "abc"), "'abc' is not LEDGER:ENTRY"),
        (("s", "--to", "1:x"), "'1:x' is not LEDGER:ENTRY"),
        (("s", "--to", "-1:0"), "'-1:0' is not LEDGER:ENTRY"),
        (("s", "--to", "persistent://t/ns/x@1:2"), "the part after '@'"),
        (("a/b", "--to-earliest"), "subscription name 'a/b' must be"),
    ],
)
def test_a_malformed_reset_is_a_usage_error(args: tuple[str, ...], said: str) -> None:
    result = invoke(*RESET, "persistent://t/ns/x", *args, "--url", "http://127.0.0.1:1")
    assert result.exit_code == 2, result.output
    assert said in one_line(result)


def test_a_malformed_deletion_is_a_usage_error() -> None:
    result = invoke(*DELETE, "persistent://t/ns/x", "", "--url", "http://127.0.0.1:1")
    assert result.exit_code == 2, result.output
    assert "subscription name '' must be" in one_line(result)


def test_repairing_a_cursor_that_reads_names_the_reset(standalone: str) -> None:
    """A user told by ``repair-cursor`` to reset the subscription is told the command."""
    topic = "persistent://t/ns/readable"
    assert invoke("topics", "create", topic, "--url", standalone).exit_code == 0

    async def subscribe() -> None:
        async with Client(standalone) as client:
            await client.admin.create_subscription(topic, "s")

    asyncio.run(subscribe())
    refused = invoke("topics", "repair-cursor", topic, "s", "--url", standalone)
    assert refused.exit_code == 1
    assert one_line(refused).startswith("Error: NotAllowed: ")
    assert one_line(refused).endswith(
        f"reset the subscription: segtxn topics reset-subscription {topic} s "
        "--to-earliest|--to-latest|--to LEDGER:ENTRY"
    )
