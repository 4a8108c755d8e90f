"""A grant may restrict its ``consume`` to named subscriptions (``subscriptions:`` patterns):
the matrix of consume-ish calls for a role restricted to ``app-*`` on acme/orders — its own
subscription passes, another's is 403 ``NotAuthorized`` naming the subscription, and a
reader (no subscription: every one) is refused; calls about no one subscription (lookups,
stats) still pass. Policy files without the key mean what they meant before."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from segtxn.auth import EVERY_SUBSCRIPTION, Action, AuthConfigError, Grant, Policy, Principal
from segtxn.client import Client
from segtxn.protocol import frames
from tests.auth.conftest import APP, CONSUMER, ROOT, SecureCluster, bearer, token
from tests.wsframes import next_frame

T1 = "persistent://acme/orders/t1"
BASE = "/ws/v2/consumer/persistent/acme/orders/t1"
_names = itertools.count(1)
_CONSUME = frozenset({Action.CONSUME})


@pytest.fixture
async def topic(secure: SecureCluster) -> SecureCluster:
    async with Client(secure.url, token=token(ROOT)) as client:
        await client.admin.create_topic(T1)
        for sub in ("app-1", "s1"):
            await client.admin.create_subscription(T1, sub, initial_position="earliest")
        producer = await client.create_producer(T1, name="seed")
        await producer.send(b"one")
        await producer.close()
    return secure


# (path, role, expected status: 0 = attaches)
WS_CASES = [
    (BASE + "/app-1", APP, 0),
    (BASE + "/app-new?initial=earliest", APP, 0),  # a new one of its own: made by attaching
    (BASE + "/s1", APP, 403),
    (BASE + "/app", APP, 403),  # "app-*" needs the dash
    (BASE + "/s1", CONSUMER, 0),  # a grant without subscriptions: every one, as before
    ("/ws/v2/reader/persistent/acme/orders/t1?start=earliest", APP, 403),
    ("/ws/v2/reader/persistent/acme/orders/t1?start=earliest", CONSUMER, 0),
]


@pytest.mark.parametrize(
    ("path", "role", "status"), WS_CASES, ids=[f"{c[1]} {c[0]}" for c in WS_CASES]
)
async def test_websocket_consume_checks_the_subscription(
    topic: SecureCluster, path: str, role: str, status: int
) -> None:
    url = topic.url + path
    if "/reader/" not in path:  # (a reader takes no name)
        url += f"{'&' if '?' in path else '?'}name=c-{next(_names)}"
    async with aiohttp.ClientSession() as http:
        if status:
            with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
                await http.ws_connect(url, headers=bearer(token(role)))
            assert caught.value.status == status
            assert caught.value.headers is not None
            assert caught.value.headers["X-Segtxn-Error"] == "NotAuthorized"
            message = caught.value.headers["X-Segtxn-Message"]
            assert "subscription" in message and APP in message, message
            return
        async with http.ws_connect(url, headers=bearer(token(role))) as ws:
            if "/reader/" not in path:
                assert isinstance(await next_frame(ws), frames.ConsumerReady)
            await ws.send_bytes(frames.encode(frames.Flow(permits=10)))
            assert isinstance(await next_frame(ws), frames.Message)


async def test_a_refused_subscription_is_not_created(topic: SecureCluster) -> None:
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError):
            await http.ws_connect(f"{topic.url}{BASE}/other-new", headers=bearer(token(APP)))
    async with Client(topic.url, token=token(ROOT)) as client:
        assert "other-new" not in await client.admin.subscriptions(T1)


async def _post(http: aiohttp.ClientSession, url: str, role: str, body: Any = None) -> Any:
    async with http.post(url, json=body, headers=bearer(token(role))) as answer:
        return answer.status, await answer.json(content_type=None) if await answer.read() else None


@pytest.mark.parametrize(("subscription", "status"), [("app-1", 204), ("s1", 403)])
async def test_joining_a_subscription_to_a_transaction_checks_it(
    topic: SecureCluster, subscription: str, status: int
) -> None:
    async with aiohttp.ClientSession() as http:
        got, meta = await _post(http, topic.txn_url + "/txn/v2/new?protocol=v4", APP)
        assert got == 200, meta
        txn = meta["txnId"]
        got, body = await _post(
            http,
            f"{topic.txn_url}/txn/v2/{txn}/subscriptions",
            APP,
            {"topics": [T1], "subscription": subscription},
        )
        assert got == status, body
        if status == 403:
            assert body["error"] == "NotAuthorized" and "'s1'" in body["message"]
        async with http.get(f"{topic.txn_url}/txn/v2/{txn}", headers=bearer(token(APP))) as answer:
            joined = (await answer.json())["subscriptions"]
        assert joined == ([[T1, subscription]] if status == 204 else [])


async def test_calls_about_no_one_subscription_still_pass(topic: SecureCluster) -> None:
    async with Client(topic.url, token=token(APP)) as client:
        assert set(await client.admin.subscriptions(T1)) >= {"app-1", "s1"}
        consumer = await client.subscribe(T1, "app-2", initial_position="earliest")
        message = await consumer.receive(timeout_s=10)
        assert message.value == b"one"
        await consumer.acknowledge(message)


def test_patterns_match_whole_names_and_restrict_consume_only() -> None:
    grant = Grant("acme/orders", frozenset(Action), ("app-*", "audit"))
    scope = ("acme", "orders")
    assert grant.covers(Action.CONSUME, scope, "app-1")
    assert grant.covers(Action.CONSUME, scope, "audit")
    assert not grant.covers(Action.CONSUME, scope, "audit-2")
    assert not grant.covers(Action.CONSUME, scope, "my-app-1")
    assert not grant.covers(Action.CONSUME, scope, EVERY_SUBSCRIPTION)
    assert grant.covers(Action.CONSUME, scope)  # about no one subscription
    assert grant.covers(Action.PRODUCE, scope, "s1")
    assert grant.covers(Action.ADMIN, scope, "s1")
    assert Grant("acme/orders", _CONSUME, ("*",)).covers(Action.CONSUME, scope, EVERY_SUBSCRIPTION)
    assert Grant("acme/orders", _CONSUME).covers(Action.CONSUME, scope, EVERY_SUBSCRIPTION)


def test_policy_files_with_and_without_subscriptions(tmp_path: Path) -> None:
    old = Policy.parse({"roles": {"r": [{"resource": "acme/*", "actions": ["consume"]}]}})
    assert old.allows(Principal("r"), _CONSUME, ("acme", "x"), "any-sub")
    new = Policy.parse(
        {"roles": {"r": [{"resource": "acme/*", "actions": ["consume"], "subscriptions": ["a*"]}]}}
    )
    assert new.allows(Principal("r"), _CONSUME, ("acme", "x"), "abc")
    assert not new.allows(Principal("r"), _CONSUME, ("acme", "x"), "bcd")


@pytest.mark.parametrize(
    ("grant", "says"),
    [
        ({"subscriptions": []}, "non-empty list"),
        ({"subscriptions": "app-*"}, "non-empty list"),
        ({"subscriptions": ["app/1"]}, "non-empty list"),
        ({"subscriptions": [""]}, "non-empty list"),
        ({"actions": ["produce"], "subscriptions": ["a"]}, "does not give"),
        ({"subscription": ["a"]}, "expected {resource"),
    ],
)
def test_a_bad_subscriptions_key_names_the_place(grant: dict[str, Any], says: str) -> None:
    data = {"resource": "acme/orders", "actions": ["consume"], **grant}
    with pytest.raises(AuthConfigError) as caught:
        Policy.parse({"roles": {"r": [data]}}, "policy.yaml")
    assert "policy.yaml: roles.r[0]" in str(caught.value) and says in str(caught.value)
