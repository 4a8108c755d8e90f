"""The refusal matrix: every REST endpoint of the broker and the coordinator, and every
WebSocket endpoint, called with no credentials, an expired token, a token signed with
another key, a valid token of a role without the right, and the right role's token.

The first three get 401 ``Unauthenticated``, the fourth 403 ``NotAuthorized`` (each with the
``X-Segtxn-Error`` header and the JSON body), and none of the four changes anything (the
cluster's topics, subscriptions, properties, segments, drains and transactions read the same
before and after); the right role's call then succeeds.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from segtxn.client import Client
from segtxn.protocol import frames
from tests.auth.conftest import (
    ADMIN,
    CLUSTER,
    CONSUMER,
    OPS,
    OTHER_SECRET,
    PRODUCER,
    PRODUCER_2,
    ROOT,
    STRANGER,
    SecureCluster,
    bearer,
    token,
)
from tests.wsframes import next_frame

T1 = "persistent://acme/orders/t1"
SC = "topic://acme/orders/sc"
P = "/admin/v2/persistent/acme/orders"
S = "/admin/v2/topic/acme/orders/sc"


@dataclass
class Case:
    """One endpoint: ``path`` may name ``{txn}``, ``{segment}``, ``{pair}`` (filled in by
    :func:`_prepare`), called by ``right`` (succeeds) and by ``wrong`` (403; None where
    every authenticated caller may)."""

    method: str
    path: str
    right: str
    wrong: str | None
    body: Any = None
    ok: bool = True
    """False where the right role's call is refused for a reason of state (a drain with
    no other broker): then it must not be an authentication or authorization refusal."""
    server: str = "broker"
    txn: str | None = None
    """Open a transaction first: ``"v5"`` or ``"v4"``, as the ``right`` role."""
    values: dict[str, str] = field(default_factory=dict)


CASES = [
    Case("GET", P, CONSUMER, STRANGER),
    Case("PUT", P + "/created", ADMIN, PRODUCER),
    Case("DELETE", P + "/gone?force=true", ADMIN, CONSUMER),
    Case("GET", P + "/t1/stats", PRODUCER, STRANGER),
    Case("GET", P + "/t1/subscriptions", CONSUMER, STRANGER),
    Case("PUT", P + "/t1/subscription/s2", ADMIN, CONSUMER),
    Case("DELETE", P + "/t1/subscription/s3", ADMIN, CONSUMER),
    Case("POST", P + "/t1/subscription/s1/reset?to=earliest", ADMIN, CONSUMER),
    Case("POST", P + "/t1/subscription/s1/repair", ADMIN, CONSUMER, ok=False),
    Case("GET", P + "/t1/properties", PRODUCER, STRANGER),
    Case("PUT", P + "/t1/properties", ADMIN, PRODUCER, body={"k": "v"}),
    Case("DELETE", P + "/t1/properties?key=k0", ADMIN, PRODUCER),
    Case("POST", P + "/t1/trim", ADMIN, PRODUCER),
    Case("POST", P + "/t1/load", ADMIN, PRODUCER),
    Case("POST", P + "/ended/terminate", ADMIN, PRODUCER),
    Case("POST", P + "/t1/txn/{txn}/end?action=ABORT", CLUSTER, OPS, txn="v4"),
    Case("POST", P + "/t1/subscription/s1/txn/{txn}/end?action=ABORT", ROOT, OPS, txn="v4"),
    Case("POST", S + "/split?segment={segment}", ADMIN, PRODUCER),
    Case("POST", S + "/merge?segments={pair}", ADMIN, CONSUMER),
    Case("GET", "/admin/v2/segment/acme/orders/sc/{segment}/stats", CONSUMER, STRANGER),
    Case("GET", "/admin/v2/topic/acme/orders", PRODUCER, STRANGER),
    Case("GET", "/admin/v2/brokers/b1/homes", OPS, ADMIN),
    Case("POST", "/admin/v2/brokers/b1/drain", OPS, ADMIN, ok=False),
    Case("DELETE", "/admin/v2/brokers/b1/drain", OPS, ADMIN),
    Case("GET", "/lookup/v2/topic/persistent/acme/orders/t1", CONSUMER, STRANGER),
    Case("GET", "/lookup/v2/topic/topic/acme/orders/sc", PRODUCER, STRANGER),
    Case("GET", "/lookup/v2/coordinators", STRANGER, None),
    Case("POST", "/replica/v1/read?ledger=x&id=1", CLUSTER, OPS, ok=False),
    Case("POST", "/txn/v2/new", STRANGER, None, server="coordinator"),
    Case("POST", "/txn/v2/new?protocol=v4", CONSUMER, None, server="coordinator"),
    Case("GET", "/txn/v2/open", OPS, ADMIN, server="coordinator"),
    Case("GET", "/txn/v2/stats", OPS, ADMIN, server="coordinator"),
    Case("GET", "/txn/v2/{txn}", PRODUCER, PRODUCER_2, server="coordinator", txn="v5"),
    Case("GET", "/txn/v2/{txn}", PRODUCER, PRODUCER_2, server="coordinator", txn="v4"),
    Case(
        "POST",
        "/txn/v2/{txn}/partitions",
        PRODUCER,
        PRODUCER_2,
        body={"topics": ["segment://acme/orders/sc/0"]},
        server="coordinator",
        txn="v5",
    ),
    Case(
        "POST",
        "/txn/v2/{txn}/partitions",
        PRODUCER,
        PRODUCER_2,
        body={"topics": [T1]},
        server="coordinator",
        txn="v4",
    ),
    Case(
        "POST",
        "/txn/v2/{txn}/subscriptions",
        PRODUCER_2,
        PRODUCER,
        body={"topics": [T1], "subscription": "s1"},
        server="coordinator",
        txn="v4",
    ),
    Case(
        "POST",
        "/txn/v2/{txn}/end?action=ABORT",
        PRODUCER,
        PRODUCER_2,
        server="coordinator",
        txn="v5",
    ),
    Case(
        "POST",
        "/txn/v2/{txn}/end?action=COMMIT",
        PRODUCER,
        PRODUCER_2,
        server="coordinator",
        txn="v4",
    ),
]


def _credentials(case: Case) -> list[tuple[str, dict[str, str], int, str]]:
    """(what, headers, status, error) of each refused call."""
    refused = [
        ("no credentials", {}, 401, "Unauthenticated"),
        ("an expired token", bearer(token(case.right, ttl_s=-600)), 401, "Unauthenticated"),
        ("another key", bearer(token(case.right, key=OTHER_SECRET)), 401, "Unauthenticated"),
    ]
    if case.wrong is not None:
        refused.append(
            ("a role without the right", bearer(token(case.wrong)), 403, "NotAuthorized")
        )
    return refused


@pytest.fixture
async def prepared(secure: SecureCluster) -> AsyncIterator[SecureCluster]:
    """t1 with subscriptions s1 and s3, a message and a property; ``gone`` and ``ended`` to
    delete and terminate; a scalable topic ``sc`` of two segments."""
    async with Client(secure.url, token=token(ROOT)) as client:
        await client.admin.create_topic(T1)
        for sub in ("s1", "s3"):
            await client.admin.create_subscription(T1, sub, initial_position="earliest")
        await client.admin.update_properties(T1, {"k0": "v0"})
        await client.admin.create_topic("persistent://acme/orders/gone")
        await client.admin.create_topic("persistent://acme/orders/ended")
        await client.admin.create_topic(SC, segments=2)
        producer = await client.create_producer(T1, name="seed")
        await producer.send(b"one")
        await producer.close()
    yield secure


async def _call(
    http: aiohttp.ClientSession,
    cluster: SecureCluster,
    case: Case,
    path: str,
    headers: dict[str, str],
) -> tuple[int, dict[str, str], Any]:
    base = cluster.url if case.server == "broker" else cluster.txn_url
    async with http.request(
        case.method, base + path, json=case.body, headers=headers, allow_redirects=False
    ) as answer:
        body = await answer.json(content_type=None) if await answer.read() else None
        return answer.status, dict(answer.headers), body


async def _root(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url, headers=bearer(token(ROOT))) as answer:
        assert answer.status == 200, (url, answer.status, await answer.text())
        return await answer.json()


async def _snapshot(http: aiohttp.ClientSession, cluster: SecureCluster, case: Case) -> Any:
    """What a refused call could have changed, read as a superuser."""
    b, c = cluster.url, cluster.txn_url
    state: dict[str, Any] = {
        "persistent": sorted(await _root(http, b + P)),
        "scalable": sorted(await _root(http, b + "/admin/v2/topic/acme/orders")),
        "subscriptions": sorted(await _root(http, b + P + "/t1/subscriptions")),
        "properties": await _root(http, b + P + "/t1/properties"),
        "cursors": {
            name: sub.get("markDeletePosition")
            for name, sub in (await _root(http, b + P + "/t1/stats"))["subscriptions"].items()
        },
        "segments": (await _root(http, b + "/lookup/v2/topic/topic/acme/orders/sc"))["segments"],
        "homes": await _root(http, b + "/admin/v2/brokers/b1/homes"),
        "open": await _root(http, c + "/txn/v2/open"),
        "ended": (await _root(http, b + P + "/ended/stats")).get("terminated"),
    }
    if "txn" in case.values:
        state["txn"] = await _root(http, c + f"/txn/v2/{case.values['txn']}")
    return state


async def _prepare(http: aiohttp.ClientSession, cluster: SecureCluster, case: Case) -> None:
    """Fill in the case's ``{txn}``, ``{segment}`` and ``{pair}`` from the cluster now."""
    if case.txn is not None:
        query = "?protocol=v4" if case.txn == "v4" else ""
        async with http.post(
            cluster.txn_url + "/txn/v2/new" + query, headers=bearer(token(case.right))
        ) as answer:
            assert answer.status == 200, await answer.text()
            case.values["txn"] = (await answer.json())["txnId"]
    layout = await _root(http, cluster.url + "/lookup/v2/topic/topic/acme/orders/sc")
    active = sorted(
        (s for s in layout["segments"] if s["state"] == "ACTIVE"), key=lambda s: s["lo"]
    )
    case.values["segment"] = str(active[0]["id"])
    case.values["pair"] = f"{active[0]['id']},{active[1]['id']}"


@pytest.mark.parametrize(
    "case", CASES, ids=[f"{c.method} {c.path} {c.txn or ''}".strip() for c in CASES]
)
async def test_rest_matrix(prepared: SecureCluster, case: Case) -> None:
    async with aiohttp.ClientSession() as http:
        await _prepare(http, prepared, case)
        path = case.path.format(**case.values)
        before = await _snapshot(http, prepared, case)
        for what, headers, status, error in _credentials(case):
            got, answer_headers, body = await _call(http, prepared, case, path, headers)
            assert (got, body and body.get("error")) == (status, error), (what, got, body)
            assert answer_headers["X-Segtxn-Error"] == error
            assert body["message"], what
        assert await _snapshot(http, prepared, case) == before, "a refused call changed something"
        got, _, body = await _call(http, prepared, case, path, bearer(token(case.right)))
        if case.ok:
            assert got < 300, (got, body)
        else:
            assert got not in (401, 403), (got, body)


async def test_probes_and_metrics_are_open(prepared: SecureCluster) -> None:
    async with aiohttp.ClientSession() as http:
        for base in (prepared.url, prepared.txn_url):
            for path in ("/healthz", "/readyz", "/metrics"):
                async with http.get(base + path) as answer:
                    assert answer.status == 200, (base, path)


# ---------------------------------------------------------------------- WebSockets

_ids = itertools.count(1)
WS = [
    ("/ws/v2/producer/persistent/acme/orders/t1", PRODUCER, CONSUMER, frames.ProducerReady),
    ("/ws/v2/consumer/persistent/acme/orders/t1/s1", CONSUMER, PRODUCER, frames.ConsumerReady),
    ("/ws/v2/producer/segment/acme/orders/sc/0", PRODUCER, STRANGER, frames.ProducerReady),
    ("/ws/v2/reader/persistent/acme/orders/t1?start=earliest", CONSUMER, PRODUCER, None),
    ("/ws/v2/lookup/topic/acme/orders/sc", PRODUCER, STRANGER, "text"),
]


def _named(base: str, path: str) -> str:
    """``path`` on ``base``, with a fresh ``name`` where the endpoint takes one (a producer,
    a consumer; a reader and a lookup session take none: it would be refused)."""
    if not path.startswith(("/ws/v2/producer/", "/ws/v2/consumer/")):
        return base + path
    sep = "&" if "?" in path else "?"
    return f"{base}{path}{sep}name=ws-{next(_ids)}"


async def _ready(ws: aiohttp.ClientWebSocketResponse, first: Any) -> None:
    """The connection works: its first frame (a reader: the stored message)."""
    if first == "text":
        assert "segments" in await ws.receive_json(timeout=10)
    elif first is None:
        await ws.send_bytes(frames.encode(frames.Flow(permits=10)))
        assert isinstance(await next_frame(ws), frames.Message)
    else:
        assert isinstance(await next_frame(ws), first)


@pytest.mark.parametrize(("path", "right", "wrong", "first"), WS, ids=[w[0] for w in WS])
async def test_websocket_matrix(
    prepared: SecureCluster, path: str, right: str, wrong: str, first: Any
) -> None:
    """A refused upgrade is an HTTP answer with the named error; the right role attaches."""
    case = Case("GET", path, right, wrong)
    async with aiohttp.ClientSession() as http:
        before = await _snapshot(http, prepared, case)
        for what, headers, status, error in _credentials(case):
            url = _named(prepared.url, path)
            with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
                await http.ws_connect(url, headers=headers)
            assert caught.value.status == status, what
            assert caught.value.headers is not None
            assert caught.value.headers["X-Segtxn-Error"] == error, what
        assert await _snapshot(http, prepared, case) == before
        url = _named(prepared.url, path)
        async with http.ws_connect(url, headers=bearer(token(right))) as ws:
            await _ready(ws, first)
