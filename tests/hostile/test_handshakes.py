"""Requests to the data-plane endpoints that are not WebSocket handshakes (a plain GET or
HEAD: a browser, a health checker, a proxy's probe) are refused 400 before anything is
done: nothing attaches to a subscription or holds a place in it."""

from __future__ import annotations

import aiohttp
import pytest

from segtxn.client import Client
from segtxn.protocol.errors import ErrorName
from segtxn.protocol.frames import ConsumerReady
from tests.cluster import Cluster
from tests.hostile.conftest import refusal
from tests.wsframes import next_frame

TOPIC = "persistent://acme/hostile/t"
URL = "/ws/v2/consumer/persistent/acme/hostile/t/sub?type=Failover&name=c1"


@pytest.mark.parametrize("method", ["GET", "HEAD"])
async def test_a_plain_request_to_a_failover_consumer_takes_no_place(
    cluster: Cluster, client: Client, http: aiohttp.ClientSession, method: str
) -> None:
    """A Failover member whose connection drops keeps its place ``consumer_hold_s``; one
    that never upgraded must not (a suspicion that did not hold even before the handshake
    was checked first: kept for what it covers)."""
    await client.admin.create_topic(TOPIC)
    await client.admin.create_subscription(TOPIC, "sub")
    async with http.request(method, f"{cluster.url}{URL}") as response:
        assert response.status == 400
        assert response.headers["X-Segtxn-Error"] == ErrorName.INVALID_ARGUMENT.value
    if method == "GET":
        assert "WebSocket" in (await refusal(http, "GET", f"{cluster.url}{URL}"))[2]
    async with http.ws_connect(f"{cluster.url}{URL.replace('c1', 'c2')}") as ws:
        ready = await next_frame(ws)
        assert isinstance(ready, ConsumerReady) and ready.active, ready


@pytest.mark.parametrize("method", ["GET", "HEAD"])
async def test_a_plain_request_to_a_consumer_creates_no_subscription(
    cluster: Cluster, client: Client, http: aiohttp.ClientSession, method: str
) -> None:
    """A consumer's handshake makes its subscription if it does not exist; a request that
    is no handshake must not (before: the subscription was made, durably, and held back
    the topic's retention from then on)."""
    await client.admin.create_topic(TOPIC)
    url = f"{cluster.url}/ws/v2/consumer/persistent/acme/hostile/t/ghost"
    async with http.request(method, url) as response:
        assert response.status == 400
    assert "ghost" not in await client.admin.subscriptions(TOPIC)
