"""A closed producer, consumer or reader says so: every call on it raises ClientClosed at
once, and stores or waits for nothing (found trying the client as a new user: a closed
scalable producer still stored what it was given)."""

from __future__ import annotations

from typing import Any

import pytest

from segtxn.client import Client, ClientClosed

PERSISTENT = "persistent://acme/closed/events"
SCALABLE = "topic://acme/closed/keyed"


def stored(stats: dict[str, Any]) -> int:
    """Messages the broker stored on a topic: its own count, or its segments'."""
    if "segments" in stats:
        return sum(int(s["stats"]["msgInCounter"]) for s in stats["segments"])
    return int(stats["msgInCounter"])


@pytest.mark.parametrize("topic", [PERSISTENT, SCALABLE])
async def test_a_closed_producer_sends_nothing(client: Client, topic: str) -> None:
    # two segments: only one has a producer when it closes (a send routed to the other
    # used to open one and store the message)
    await client.admin.create_topic(topic, **({"segments": 2} if topic == SCALABLE else {}))
    producer = await client.create_producer(topic)
    await producer.send(b"before", key="k")
    await producer.close()
    for _ in range(2):  # unkeyed: round-robin, one to each segment
        with pytest.raises(ClientClosed, match=f"producer {producer.name} is closed"):
            await producer.send_async(b"after")
    with pytest.raises(ClientClosed):
        await producer.send(b"after", key="k")
    await producer.close()  # again: nothing to do
    assert stored(await client.admin.stats(topic)) == 1
