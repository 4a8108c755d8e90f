"""A v4 decision fanned out to a participant whose topic moved to another broker
(segtxn/coordinator/fanout.py): the broker the fan-out found answers ``NotOwner``, and the
decision is taken where the topic is served now, within ``fan_out_timeout_s``; the
END_TXN succeeds.

- A broker's ``NotOwner`` is a 307 naming the serving broker (``Location``), which the
  fan-out's HTTP client follows (a drain's move, the coordinator's look-up made just before
  it: real brokers X and Y on one store and ledger directory).
- A ``NotOwner`` that reaches the fan-out all the same (no ``Location`` to follow: a
  stand-in broker answers it) is a participant moving, not a refusal: the fan-out looks the
  topic up again and tries there. It was a refusal: the coordinator answered the client's
  END_TXN with it, a 307 with nowhere to go, which the client took for a success while the
  transaction stayed COMMITTING."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator

import msgspec
import pytest
from aiohttp import web

from segtxn.broker.app import BrokerServer
from segtxn.client import Client
from segtxn.coordinator.app import V4
from segtxn.protocol.names import TopicName
from segtxn.topics.catalog import HOMES_BY_BROKER, BrokerInfo, Catalog, broker_key, home_key
from segtxn.web import Listener
from tests.cluster import Cluster
from tests.txn.test_v4_moved_back import move

TOPIC = "persistent://acme/v4/moving"
NAME = TopicName.parse(TOPIC)


@pytest.fixture
async def y(cluster: Cluster) -> AsyncIterator[BrokerServer]:
    """Another broker on the cluster's store and ledger directory."""
    listener = Listener("127.0.0.1")  # its port, held from the pick on
    broker = BrokerServer(
        dataclasses.replace(
            cluster.broker.settings,
            broker_id="b2",
            advertise_url=f"http://127.0.0.1:{listener.port}",
        ),
        store=cluster.store,
        listener=listener,
    )
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


async def _home(cluster: Cluster, broker_id: str) -> None:
    await cluster.store.put(
        home_key(NAME), msgspec.json.encode(broker_id), indexes={HOMES_BY_BROKER: broker_id}
    )


@pytest.mark.parametrize("action", ["commit", "abort"])
async def test_a_participant_that_moved_takes_the_decision_at_its_new_broker(
    cluster: Cluster, y: BrokerServer, monkeypatch: pytest.MonkeyPatch, action: str
) -> None:
    async with Client(cluster.url) as client:
        await client.admin.create_topic(TOPIC)
        home = await cluster.broker.service.catalog.home_of(NAME)
        source, target = (
            (cluster.broker, y) if home == cluster.broker.service.broker_id else (y, cluster.broker)
        )
        producer = await client.create_producer(TOPIC)
        consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
        txn = client.transaction()
        await producer.send(b"in-txn", txn=txn)
        await move(source.service, target.service, NAME)

        stale = [0]
        home_of = Catalog.home_of
        coordinator_catalog = cluster.coordinator.app[V4]._catalog

        async def stale_home_of(self: Catalog, ledger: TopicName) -> str | None:
            if self is coordinator_catalog and ledger == NAME and not stale[0]:
                stale[0] += 1  # the look-up made just before the move
                return source.service.broker_id
            return await home_of(self, ledger)

        monkeypatch.setattr(Catalog, "home_of", stale_home_of)
        await (txn.commit() if action == "commit" else txn.abort())
        assert stale == [1]
        assert await txn.status() == ("COMMITTED" if action == "commit" else "ABORTED")
        await producer.send(b"after")
        expected = [b"in-txn", b"after"] if action == "commit" else [b"after"]
        got = [(await consumer.receive(timeout_s=10)).value for _ in expected]
        assert got == expected


async def test_a_not_owner_that_reaches_the_fan_out_is_looked_up_again(
    cluster: Cluster,
) -> None:
    """The topic's home names a stand-in broker that answers NotOwner with nothing to
    follow; once the topic is home on the cluster's broker again (within the fan-out's
    time limit) the commit goes there and END_TXN succeeds, with no second END_TXN."""
    hit = asyncio.Event()

    async def not_owner(request: web.Request) -> web.Response:
        hit.set()
        body = {"error": "NotOwner", "message": f"{TOPIC} is served by another broker"}
        return web.Response(status=307, text=json.dumps(body), content_type="application/json")

    app = web.Application()
    app.router.add_post("/{tail:.*}", not_owner)
    runner = web.AppRunner(app)
    await runner.setup()
    listener = Listener("127.0.0.1")  # its port, held from the pick on
    port = listener.port
    await web.SockSite(runner, listener.socket).start()
    try:
        async with Client(cluster.url) as client:
            await client.admin.create_topic(TOPIC)
            producer = await client.create_producer(TOPIC)
            txn = client.transaction()
            await producer.send(b"x", txn=txn)
            moved = BrokerInfo("b-moved", f"http://127.0.0.1:{port}", int(time.time() * 1000))
            await cluster.store.put(broker_key("b-moved"), msgspec.json.encode(moved))
            await _home(cluster, "b-moved")
            ending = asyncio.create_task(txn.commit())
            await asyncio.wait_for(hit.wait(), 10)  # it answered NotOwner
            await _home(cluster, cluster.broker.service.broker_id)
            await asyncio.wait_for(ending, 10)  # within fan_out_timeout_s (2 s here)
            assert await txn.status() == "COMMITTED"
    finally:
        await runner.cleanup()
