"""A client forgets the producers, consumers and readers closed one by one (found by a
reviewer: it kept every one it ever made, so a long-lived client making one per request
grew without bound), while ``Client.close()`` still closes every one left open."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from segtxn.client import Client, ClientClosed
from tests.cluster import Cluster
from tests.waiting import wait_until

PERSISTENT = "persistent://acme/forget/events"
SCALABLE = "topic://acme/forget/keyed"
ROUNDS = 20

pytestmark = pytest.mark.parametrize("cluster", ["memory"], indirect=True)


def makers(client: Client) -> dict[str, Callable[[], Awaitable[Any]]]:
    """Each kind of thing a client makes and closes."""
    return {
        "producer": lambda: client.create_producer(PERSISTENT),
        "scalable producer": lambda: client.create_producer(SCALABLE),
        "consumer": lambda: client.subscribe(PERSISTENT, "billing"),
        "scalable consumer": lambda: client.subscribe(SCALABLE, "billing"),
        "checkpoint consumer": lambda: client.checkpoint_consumer(SCALABLE),
        "reader": lambda: client.create_reader(PERSISTENT),
    }


async def test_what_is_closed_is_forgotten(client: Client) -> None:
    await client.admin.create_topic(PERSISTENT)
    await client.admin.create_topic(SCALABLE, segments=2)
    kept = await client.create_producer(PERSISTENT)  # open throughout: it stays
    closed: dict[str, list[weakref.ref[Any]]] = {}
    for kind, make in makers(client).items():
        for _ in range(ROUNDS):
            made = await make()
            await made.close()
            closed.setdefault(kind, []).append(weakref.ref(made))
            del made
    gc.collect()
    alive = {kind: sum(r() is not None for r in refs) for kind, refs in closed.items()}
    assert alive == dict.fromkeys(closed, 0), "closed ones the client still holds"
    await kept.send(b"still open")


async def test_close_still_closes_every_open_one(cluster: Cluster) -> None:
    async with Client(cluster.url) as setup:
        await setup.admin.create_topic(PERSISTENT)
        await setup.admin.create_topic(SCALABLE, segments=2)
    client = Client(cluster.url)
    await client.__aenter__()
    made = {kind: await make() for kind, make in makers(client).items()}
    early = await client.create_producer(PERSISTENT)
    await early.close()  # one closed before: forgotten, and no trouble for close()
    await client.close()
    for kind, thing in made.items():
        with pytest.raises(ClientClosed):
            if "producer" in kind:
                await thing.send(b"after close", key="k")
            else:
                await thing.receive(timeout_s=0)
    async with Client(cluster.url) as after:

        async def disconnected() -> bool:  # the broker sees a socket close a moment later
            stats = await after.admin.stats(PERSISTENT)
            return (stats["producers"], stats["subscriptions"]["billing"]["consumers"]) == (0, 0)

        await wait_until(disconnected, what="every open one disconnected")
