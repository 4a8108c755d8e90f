"""A query parameter given twice is refused (400 InvalidArgument naming it), on the broker
and on the coordinator, before anything is done: a request that says two things at once
(``?action=COMMIT&action=ABORT``) is not resolved by picking one of them."""

from __future__ import annotations

import aiohttp
import pytest
import yarl

from segtxn.client import Client
from segtxn.protocol.errors import ErrorName
from tests.cluster import Cluster
from tests.hostile.conftest import refusal

TOPIC = "persistent://acme/hostile/t"
PATH = "acme/hostile/t"


async def test_an_end_with_two_actions_is_refused_and_the_transaction_stays_open(
    cluster: Cluster, client: Client, http: aiohttp.ClientSession
) -> None:
    coordinator = cluster.coordinator.settings.advertise_url
    async with http.post(f"{coordinator}/txn/v2/new") as response:
        txn = (await response.json())["txnId"]
    url = yarl.URL(f"{coordinator}/txn/v2/{txn}/end").with_query(
        [("action", "COMMIT"), ("action", "ABORT")]
    )
    status, name, message = await refusal(http, "POST", url)
    assert (status, name) == (400, ErrorName.INVALID_ARGUMENT.value)
    assert "action" in message and "2 times" in message
    async with http.get(f"{coordinator}/txn/v2/{txn}") as response:
        assert (await response.json())["state"] == "OPEN"


@pytest.mark.parametrize(
    "request_line",
    [
        ("POST", f"/admin/v2/persistent/{PATH}/subscription/sub/reset", "to=earliest&to=latest"),
        ("PUT", "/admin/v2/topic/acme/hostile/s", "segments=2&segments=4"),
        ("GET", f"/ws/v2/producer/persistent/{PATH}", "name=a&name=b"),
        ("GET", f"/ws/v2/consumer/persistent/{PATH}/sub", "type=Shared&type=Exclusive"),
    ],
)
async def test_a_parameter_given_twice_on_the_broker_is_invalid_argument(
    cluster: Cluster,
    client: Client,
    http: aiohttp.ClientSession,
    request_line: tuple[str, str, str],
) -> None:
    method, path, query = request_line
    await client.admin.create_topic(TOPIC)
    await client.admin.create_subscription(TOPIC, "sub")
    url = yarl.URL(f"{cluster.url}{path}?{query}", encoded=True)
    status, name, message = await refusal(http, method, url)
    assert (status, name) == (400, ErrorName.INVALID_ARGUMENT.value), message
    assert "given 2 times" in message
    assert not await client.admin.list_topics("topic", "acme", "hostile")
