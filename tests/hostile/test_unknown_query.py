"""A query parameter an endpoint does not take is refused (400 InvalidArgument naming it
and the ones the endpoint takes), on every endpoint of the broker and the coordinator,
before anything is done: ``?segmnets=4`` on a topic's create made a 1-segment topic
silently (only a topic's ``DELETE`` refused unknown parameters)."""

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


async def test_a_misspelt_segments_creates_nothing(
    cluster: Cluster, client: Client, http: aiohttp.ClientSession
) -> None:
    url = f"{cluster.url}/admin/v2/topic/acme/hostile/s?segmnets=4"
    status, name, message = await refusal(http, "PUT", url)
    assert (status, name) == (400, ErrorName.INVALID_ARGUMENT.value), message
    assert "'segmnets'" in message and "takes segments" in message, message
    assert not await client.admin.list_topics("topic", "acme", "hostile")


@pytest.mark.parametrize(
    "request_line",
    [
        ("GET", f"/admin/v2/persistent/{PATH}/stats", "verbose=1", "takes no query parameters"),
        ("PUT", f"/admin/v2/persistent/{PATH}/subscription/s", "inital=earliest", "initial"),
        ("POST", f"/admin/v2/persistent/{PATH}/subscription/s/reset", "t=earliest", "to"),
        ("GET", f"/ws/v2/producer/persistent/{PATH}", "nmae=a", "instance, name"),
        ("GET", f"/ws/v2/reader/persistent/{PATH}", "from=earliest", "end, start"),
        ("GET", "/admin/v2/brokers/b1/homes", "max=3", "limit"),
        ("GET", "/healthz", "verbose=1", "takes no query parameters"),
    ],
)
async def test_an_unknown_parameter_on_the_broker_is_invalid_argument(
    cluster: Cluster,
    client: Client,
    http: aiohttp.ClientSession,
    request_line: tuple[str, str, str, str],
) -> None:
    method, path, query, takes = request_line
    await client.admin.create_topic(TOPIC)
    url = yarl.URL(f"{cluster.url}{path}?{query}", encoded=True)
    status, name, message = await refusal(http, method, url)
    assert (status, name) == (400, ErrorName.INVALID_ARGUMENT.value), message
    assert repr(query.partition("=")[0]) in message and takes in message, message
    assert not await client.admin.subscriptions(TOPIC)


@pytest.mark.parametrize(
    "request_line",
    [
        ("POST", "/txn/v2/new", "timeout=5", "count, protocol, timeout_s"),
        ("GET", "/txn/v2/open", "max=5", "limit"),
        ("GET", "/txn/v2/stats", "all=1", "takes no query parameters"),
    ],
)
async def test_an_unknown_parameter_on_the_coordinator_is_invalid_argument(
    cluster: Cluster,
    http: aiohttp.ClientSession,
    request_line: tuple[str, str, str, str],
) -> None:
    method, path, query, takes = request_line
    coordinator = cluster.coordinator.settings.advertise_url
    url = yarl.URL(f"{coordinator}{path}?{query}", encoded=True)
    status, name, message = await refusal(http, method, url)
    assert (status, name) == (400, ErrorName.INVALID_ARGUMENT.value), message
    assert repr(query.partition("=")[0]) in message and takes in message, message
    async with http.get(f"{coordinator}/txn/v2/open") as response:
        assert not (await response.json())["transactions"]


async def test_an_end_with_a_misspelt_action_leaves_the_transaction_open(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    coordinator = cluster.coordinator.settings.advertise_url
    async with http.post(f"{coordinator}/txn/v2/new") as response:
        txn = (await response.json())["txnId"]
    url = f"{coordinator}/txn/v2/{txn}/end?action=ABORT&reason=mine"
    status, name, message = await refusal(http, "POST", url)
    assert (status, name) == (400, ErrorName.INVALID_ARGUMENT.value), message
    assert "'reason'" in message and "takes action" in message, message
    async with http.get(f"{coordinator}/txn/v2/{txn}") as response:
        assert (await response.json())["state"] == "OPEN"
