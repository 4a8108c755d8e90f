"""A query parameter an endpoint does not take is refused after authentication: a request
without valid credentials gets its 401, a role that may not call the endpoint its 403,
exactly as without the parameter (neither learns which parameters the endpoint takes);
only a caller that may call it gets the 400 InvalidArgument naming the parameter. The
first version of the check ran before authentication and answered 400 to everyone."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
import yarl

from segtxn.client import Client
from segtxn.protocol.errors import ErrorName
from tests.auth.conftest import (
    CLUSTER,
    CONSUMER,
    OPS,
    OTHER_SECRET,
    PRODUCER,
    ROOT,
    STRANGER,
    SecureCluster,
    bearer,
    token,
)

T1 = "persistent://acme/orders/t1"


@pytest.fixture
async def topic(secure: SecureCluster) -> AsyncIterator[SecureCluster]:
    async with Client(secure.url, token=token(ROOT)) as client:
        await client.admin.create_topic(T1)
    yield secure


async def _answer(
    http: aiohttp.ClientSession, method: str, url: str, headers: dict[str, str]
) -> tuple[int, str, str]:
    """(status, X-Segtxn-Error, message) of one plain request (a WebSocket's handshake is
    refused before the upgrade, so a plain GET gets the same answer)."""
    async with http.request(method, yarl.URL(url, encoded=True), headers=headers) as response:
        body = await response.json(content_type=None) if await response.read() else None
        message = body.get("message", "") if isinstance(body, dict) else ""
        return response.status, response.headers.get("X-Segtxn-Error", ""), str(message)


# (method, path on the broker or "txn:" the coordinator, the wrong parameter, right, wrong)
CASES = [
    ("PUT", "/admin/v2/topic/acme/orders/s?segmnets=4", "segmnets", OPS, CONSUMER),
    ("GET", "/admin/v2/persistent/acme/orders/t1/stats?verbose=1", "verbose", CONSUMER, STRANGER),
    ("GET", "/ws/v2/producer/persistent/acme/orders/t1?nmae=p", "nmae", PRODUCER, CONSUMER),
    ("GET", "/ws/v2/reader/persistent/acme/orders/t1?name=r", "name", CONSUMER, PRODUCER),
    ("GET", "/ws/v2/lookup/persistent/acme/orders/t1?name=l", "name", CONSUMER, STRANGER),
    ("POST", "/replica/v1/read?ledger=x&id=1&nmae=x", "nmae", CLUSTER, OPS),
    ("POST", "txn:/txn/v2/new?timeout=5", "timeout", PRODUCER, None),
    ("GET", "txn:/txn/v2/open?max=5", "max", OPS, CONSUMER),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]} {c[1]}" for c in CASES])
async def test_an_unknown_parameter_is_refused_only_to_a_caller_who_may_call(
    topic: SecureCluster, case: tuple[str, str, str, str, str | None]
) -> None:
    method, path, wrong_parameter, right, wrong = case
    base, path = (topic.txn_url, path[4:]) if path.startswith("txn:") else (topic.url, path)
    refused = [
        ({}, 401, ErrorName.UNAUTHENTICATED),
        (bearer(token(right, ttl_s=-600)), 401, ErrorName.UNAUTHENTICATED),
        (bearer(token(right, key=OTHER_SECRET)), 401, ErrorName.UNAUTHENTICATED),
    ]
    if wrong is not None:
        refused.append((bearer(token(wrong)), 403, ErrorName.NOT_AUTHORIZED))
    async with aiohttp.ClientSession() as http:
        for headers, status, error in refused:
            got = await _answer(http, method, base + path, headers)
            assert got[:2] == (status, error.value), got
            assert wrong_parameter not in got[2] and "parameter" not in got[2], got
        got = await _answer(http, method, base + path, bearer(token(right)))
        assert got[:2] == (400, ErrorName.INVALID_ARGUMENT.value), got
        assert f"unknown parameter {wrong_parameter!r}" in got[2], got
