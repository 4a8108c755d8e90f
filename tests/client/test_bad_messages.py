"""A message the broker could not read is refused by the client before it is queued, alone:
the sends beside it travel in the same frame, and a frame the broker cannot decode is refused
whole (before, one property of the wrong type failed every send in flight with it, after the
send timeout, with an outcome unknown)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from segtxn.client import Client

PERSISTENT = "persistent://acme/ops/bad-messages"
SCALABLE = "topic://acme/ops/bad-messages"

BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"value": "text"}, TypeError, "value is bytes, not str"),
    ({"key": 7}, TypeError, "key is a str or None, not int"),
    ({"properties": {"a": 1}}, TypeError, "map str to str, not str to int"),
    ({"properties": {1: "a"}}, TypeError, "map str to str, not int to str"),
    ({"properties": [("a", "b")]}, TypeError, "properties are a mapping, not list"),
    ({"event_time_ms": 1.5}, TypeError, "event_time_ms is an int or None, not float"),
    ({"event_time_ms": True}, TypeError, "event_time_ms is an int or None, not bool"),
    ({"event_time_ms": -1}, ValueError, "event_time_ms must be in 0.."),
]


@pytest.mark.parametrize("topic", [PERSISTENT, SCALABLE])
async def test_a_bad_message_is_refused_alone_and_its_neighbours_are_stored(
    client: Client, topic: str
) -> None:
    if topic == SCALABLE:
        await client.admin.create_topic(topic, segments=2)
    else:
        await client.admin.create_topic(topic)
    producer = await client.create_producer(topic)
    consumer = await client.subscribe(topic, "s", initial_position="earliest")
    good = [await producer.send_async(b"before", key="k")]
    for fields, error, message in BAD:
        call: dict[str, Any] = {"value": b"bad", **fields}
        with pytest.raises(error, match=message):
            await producer.send_async(call.pop("value"), **call)
    good.append(await producer.send_async(b"after", key="k", properties={"p": "v"}))
    async with asyncio.timeout(10):  # at once, not after the send timeout
        await asyncio.gather(*good)
    got = [await consumer.receive(timeout_s=10) for _ in range(2)]
    assert [m.value for m in got] == [b"before", b"after"]
    assert got[1].properties == {"p": "v"}
    await producer.close()
    await consumer.close()
