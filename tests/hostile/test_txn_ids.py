"""A transaction id in a path is ``MOST:LEAST`` in lowercase hex and nothing else: one with
a trailing newline (``%0A``) is refused as InvalidArgument by the coordinator and the
broker, not taken for the id before it (a regular expression's ``$`` matches before a
final newline)."""

from __future__ import annotations

import aiohttp
import pytest

from segtxn.client import Client
from segtxn.protocol.errors import ErrorName
from segtxn.protocol.txn import TxnId
from tests.cluster import Cluster
from tests.hostile.conftest import refusal

TOPIC = "persistent://acme/hostile/t"


@pytest.mark.parametrize("tail", ["%0A", "%0D%0A", "%20", "%00"])
async def test_a_transaction_id_with_a_trailing_character_is_invalid_argument(
    cluster: Cluster, client: Client, http: aiohttp.ClientSession, tail: str
) -> None:
    coordinator = cluster.coordinator.settings.advertise_url
    async with http.post(f"{coordinator}/txn/v2/new") as response:
        txn = (await response.json())["txnId"]
    await client.admin.create_topic(TOPIC)
    for method, url in [
        ("GET", f"{coordinator}/txn/v2/{txn}{tail}"),
        ("POST", f"{coordinator}/txn/v2/{txn}{tail}/end?action=ABORT"),
        ("POST", f"{cluster.url}/admin/v2/persistent/acme/hostile/t/txn/{txn}{tail}/end"),
    ]:
        status, name, message = await refusal(http, method, url)
        assert (status, name) == (400, ErrorName.INVALID_ARGUMENT.value), (url, message)
    async with http.get(f"{coordinator}/txn/v2/{txn}") as response:
        assert (await response.json())["state"] == "OPEN"


@pytest.mark.parametrize("text", ["1:2\n", "1:2 ", "\n1:2", "1:2\r\n", "1:2\x00"])
def test_parse_takes_the_id_and_nothing_else(text: str) -> None:
    with pytest.raises(ValueError, match="not a transaction id"):
        TxnId.parse(text)
