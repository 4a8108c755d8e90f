"""A coordinator whose metadata store does not answer says so with a retriable
ServiceNotReady (503), never a 500 (a soak finding: an etcd restart crashed processors)."""

from __future__ import annotations

import aiohttp

from segtxn.client import Client
from tests.cluster import Cluster


async def test_an_unreachable_store_is_service_not_ready(client: Client, cluster: Cluster) -> None:
    url = cluster.coordinator.settings.advertise_url
    cluster.faults.fail("txn", times=None)
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{url}/txn/v2/new", params={"timeout_s": "5"}) as response,
        ):
            body = await response.json()
            assert response.status == 503, body
            assert response.headers["X-Segtxn-Error"] == "ServiceNotReady"
            assert body["error"] == "ServiceNotReady" and "metadata store" in body["message"]
    finally:
        cluster.faults.clear()  # so the fixture's stop can resign the coordinator's ids
    txn = await client.transaction().start()  # and it works again
    await txn.abort()
