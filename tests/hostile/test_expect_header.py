"""An ``Expect:`` header other than ``100-continue`` (the only expectation HTTP defines) is
refused 417 in the project's error shape, on the broker and on the coordinator, on a path
that exists and on one that does not, before anything is read or done; ``100-continue``
still works. aiohttp refused it before any middleware ran, with a plain-text 417 that no
segtxn client could read a name from."""

from __future__ import annotations

import aiohttp
import pytest

from segtxn.client import Client
from segtxn.protocol.errors import ErrorName
from tests.cluster import Cluster
from tests.hostile.conftest import refusal

TOPIC = "persistent://acme/hostile/expect"


@pytest.mark.parametrize("expect", ["200-ok", "100-Continue-please", "x" * 200])
async def test_an_unknown_expectation_is_refused_in_the_error_shape(
    cluster: Cluster, client: Client, http: aiohttp.ClientSession, expect: str
) -> None:
    await client.admin.create_topic(TOPIC)
    coordinator = cluster.coordinator.settings.advertise_url
    properties = f"{cluster.url}/admin/v2/persistent/acme/hostile/expect/properties"
    for method, url in [
        ("PUT", properties),
        ("GET", f"{cluster.url}/no/such/path"),
        ("POST", f"{coordinator}/txn/v2/1000000000000:1/partitions"),
    ]:
        status, name, message = await refusal(
            http, method, url, json={"garbage": "yes"}, headers={"Expect": expect}
        )
        assert (status, name) == (417, ErrorName.INVALID_ARGUMENT.value), message
        assert message == (
            f"Expect: {expect[:80]!r} is not an expectation this server meets "
            "(only 100-continue is)"
        )
    assert "garbage" not in await client.admin.properties(TOPIC)
    async with http.put(
        properties, json={"after": "yes"}, headers={"Expect": "100-continue"}
    ) as response:
        assert response.status == 204, await response.text()
    assert (await client.admin.properties(TOPIC))["after"] == "yes"
