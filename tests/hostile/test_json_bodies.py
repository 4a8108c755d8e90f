"""A JSON body that names a key twice is refused (400 InvalidArgument naming the key) by
every endpoint that reads one, before anything is done: ``{"a": "1", "a": "2"}`` says two
things, and which one a parser keeps is not something a client can rely on."""

from __future__ import annotations

import aiohttp
import pytest

from segtxn.client import Client
from segtxn.protocol.errors import ErrorName
from tests.cluster import Cluster
from tests.hostile.conftest import refusal

TOPIC = "persistent://acme/hostile/t"
PATH = "/admin/v2/persistent/acme/hostile/t"


async def test_a_property_set_twice_in_one_body_is_refused_and_nothing_is_stored(
    cluster: Cluster, client: Client, http: aiohttp.ClientSession
) -> None:
    await client.admin.create_topic(TOPIC)
    body = b'{"owner": "alice", "team": "x", "owner": "bob"}'
    status, name, message = await refusal(http, "PUT", f"{cluster.url}{PATH}/properties", data=body)
    assert (status, name) == (400, ErrorName.INVALID_ARGUMENT.value)
    assert "'owner'" in message and "twice" in message
    properties = await client.admin.properties(TOPIC)
    assert "owner" not in properties and "team" not in properties


@pytest.mark.parametrize(
    "body",
    [
        b'{"topics": ["persistent://acme/hostile/t"], "topics": []}',
        b'{"topics": ["persistent://acme/hostile/t"], "subscription": "a", "subscription": "b"}',
    ],
)
async def test_a_key_twice_in_a_coordinator_body_is_refused(
    cluster: Cluster, client: Client, http: aiohttp.ClientSession, body: bytes
) -> None:
    coordinator = cluster.coordinator.settings.advertise_url
    async with http.post(f"{coordinator}/txn/v2/new") as response:
        txn = (await response.json())["txnId"]
    url = f"{coordinator}/txn/v2/{txn}/subscriptions"
    status, name, message = await refusal(http, "POST", url, data=body)
    assert (status, name) == (400, ErrorName.INVALID_ARGUMENT.value)
    assert "twice" in message


async def test_a_key_twice_in_a_nested_object_is_refused(
    cluster: Cluster, client: Client, http: aiohttp.ClientSession
) -> None:
    """Every object of the body, not only the outer one (the limit on depth holds too)."""
    url = f"{cluster.url}/txn/v2/1000000000000:1/commit"
    body = b'{"ops": 1, "digest": 0, "x": [{"k": 1, "k": 2}]}'
    status, name, message = await refusal(http, "POST", url, data=body)
    assert (status, name) == (400, ErrorName.INVALID_ARGUMENT.value)
    assert "'k'" in message


@pytest.mark.parametrize("where", ["broker", "coordinator"])
async def test_a_number_of_thousands_of_digits_is_invalid_argument(
    cluster: Cluster, client: Client, http: aiohttp.ClientSession, where: str
) -> None:
    """Python's json refuses an integer of over 4300 digits with a plain ValueError (not a
    JSONDecodeError): it was a 500 with an incident."""
    await client.admin.create_topic(TOPIC)
    body = b'{"ops": ' + b"7" * 5000 + b', "digest": 0, "topics": []}'
    if where == "broker":
        url = f"{cluster.url}/txn/v2/1000000000000:1/commit"
    else:
        url = f"{cluster.coordinator.settings.advertise_url}/txn/v2/1000000000000:1/partitions"
    status, name, message = await refusal(http, "POST", url, data=body)
    assert (status, name) == (400, ErrorName.INVALID_ARGUMENT.value), message
    assert "digits" in message
