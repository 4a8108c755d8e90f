"""Every time limit the client takes is None or a finite number of seconds >= 0, checked
before the call does anything (found trying the client as a new user: ``receive(timeout_s=
nan)`` waited forever or gave up at once, a negative one timed out at once, and ``"1"``
failed with an internal TypeError)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from segtxn.client import Client, Message, Timeout
from segtxn.client.timeouts import checked_limit
from tests.waiting import wait_until

PERSISTENT = "persistent://acme/limits/events"
SCALABLE = "topic://acme/limits/keyed"

BAD: list[tuple[Any, type[Exception], str]] = [
    (
        math.nan,
        ValueError,
        "a finite number of seconds >= 0, or None for no limit; got nan",
    ),
    (math.inf, ValueError, "got inf"),
    (-1.0, ValueError, "got -1.0"),
    (-1, ValueError, "got -1"),
    ("1", TypeError, "is a number of seconds or None \\(no limit\\), not str"),
    (True, TypeError, "not bool"),
]


@pytest.mark.parametrize("value, error, said", BAD)
def test_a_limit_is_none_or_a_finite_number_of_seconds(
    value: Any, error: type[Exception], said: str
) -> None:
    with pytest.raises(error, match=f"^send_timeout_s .*{said}"):
        checked_limit(value, "send_timeout_s")
    for good in (None, 0, 0.0, 2, 2.5):
        assert checked_limit(good) == (None if good is None else float(good))


@pytest.mark.parametrize("value, error, said", BAD)
@pytest.mark.parametrize("topic", [PERSISTENT, SCALABLE, "reader"])
async def test_receive_refuses_a_limit_that_is_not_one_at_once(
    client: Client, topic: str, value: Any, error: type[Exception], said: str
) -> None:
    if topic == "reader":
        await client.admin.create_topic(PERSISTENT)
        receiver: Any = await client.create_reader(PERSISTENT)
    else:
        await client.admin.create_topic(topic)
        receiver = await client.subscribe(topic, "s")
    async with asyncio.timeout(5):  # at once: nan used to wait for ever
        with pytest.raises(error, match=f"timeout_s .*{said}"):
            await receiver.receive(timeout_s=value)


@pytest.mark.parametrize("topic", [PERSISTENT, SCALABLE])
async def test_receive_with_no_time_takes_only_what_is_there(client: Client, topic: str) -> None:
    await client.admin.create_topic(topic)
    consumer = await client.subscribe(topic, "s", initial_position="earliest")
    async with asyncio.timeout(5):  # nothing there: it does not wait
        with pytest.raises(Timeout, match="no message within 0 s"):
            await consumer.receive(timeout_s=0)
    producer = await client.create_producer(topic)
    await producer.send(b"m", key="k")
    got: list[Message] = []

    async def arrived() -> bool:
        try:
            got.append(await consumer.receive(timeout_s=0))
        except Timeout:
            return False
        return True

    await wait_until(arrived, what="receive(timeout_s=0) to hand out the message")
    assert [m.value for m in got] == [b"m"]


async def test_every_call_refuses_a_limit_that_is_not_one(client: Client) -> None:
    await client.admin.create_topic(PERSISTENT)
    producer = await client.create_producer(PERSISTENT)
    consumer = await client.subscribe(PERSISTENT, "s", initial_position="earliest")
    await producer.send(b"m")
    message = await consumer.receive(timeout_s=10)
    txn = client.transaction()
    calls: list[Callable[[Any], Coroutine[Any, Any, object]]] = [
        lambda t: client.create_producer(PERSISTENT, timeout_s=t),
        lambda t: client.subscribe(PERSISTENT, "other", timeout_s=t),
        lambda t: client.create_reader(PERSISTENT, timeout_s=t),
        lambda t: client.checkpoint_consumer(SCALABLE, timeout_s=t),
        lambda t: consumer.acknowledge(message, timeout_s=t),
        lambda t: consumer.acknowledge_cumulative(message, timeout_s=t),
        lambda t: consumer.negative_acknowledge(message, timeout_s=t),
        lambda t: consumer.redeliver_unacknowledged(timeout_s=t),
        lambda t: producer.flush(timeout_s=t),
        lambda t: producer.close(timeout_s=t),
        lambda t: txn.start(timeout_s=t),
        lambda t: txn.commit(timeout_s=t),
        lambda t: txn.abort(timeout_s=t),
        lambda t: client.admin.drain_broker("b1", timeout_s=t),
        lambda t: client.close(timeout_s=t),
    ]
    for value, error, said in BAD:
        for call in calls:
            async with asyncio.timeout(5):
                with pytest.raises(error, match=f"timeout_s .*{said}"):
                    await call(value)
    # none of them did anything: the producer is open, the message not acknowledged
    assert txn.state == "NEW"
    await producer.send(b"after")
    assert (await client.admin.stats(PERSISTENT))["subscriptions"]["s"]["backlog"] == 2


@pytest.mark.parametrize("value, error, said", BAD)
async def test_options_refuse_a_limit_that_is_not_one(
    client: Client, value: Any, error: type[Exception], said: str
) -> None:
    await client.admin.create_topic(PERSISTENT)
    with pytest.raises(error, match=f"send_timeout_s .*{said}"):
        await client.create_producer(PERSISTENT, send_timeout_s=value)
    for option in ("operation_timeout_s", "request_timeout_s"):
        with pytest.raises(error, match=f"{option} .*{said}"):
            Client(client.service_url, **{option: value})


@pytest.mark.parametrize(
    "value, error, said",
    [
        (math.nan, ValueError, "must be a finite number of seconds > 0; got nan"),
        (math.inf, ValueError, "got inf"),
        (-1.0, ValueError, "got -1.0"),
        (0, ValueError, "got 0"),
        ("10", TypeError, "is a number of seconds > 0, not str"),
        (True, TypeError, "not bool"),
        (None, TypeError, "not None"),
    ],
)
async def test_a_transactions_lifetime_is_checked_at_the_call(
    client: Client, value: Any, error: type[Exception], said: str
) -> None:
    """``client.transaction(timeout_s=)`` took anything: nan, 0 or a negative number failed
    later, at the first send, as the coordinator's InvalidArgument, and ``"10"`` was sent
    as it was (and accepted)."""
    with pytest.raises(error, match=rf"^timeout_s \(the transaction's lifetime\) .*{said}$"):
        client.transaction(timeout_s=value)


async def test_a_transactions_lifetime_may_be_an_int(client: Client) -> None:
    txn = await client.transaction(timeout_s=5).start()
    assert await txn.status() == "OPEN"
    await txn.abort()
