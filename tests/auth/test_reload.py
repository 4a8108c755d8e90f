"""The key, the policy and the cluster token are reloaded when their files change, without
a restart: a new policy applies to new requests and to the frames of WebSockets already
open, a new key (with a cluster token signed by it) verifies from then on and the servers'
own calls carry the new cluster token, and a broken new set is refused with one WARNING
line while the old one stays in force."""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from segtxn.auth.credentials import LiveCredentials
from segtxn.client import Client
from segtxn.protocol import frames
from tests.auth.conftest import (
    CLUSTER,
    CONSUMER,
    OTHER_SECRET,
    POLICY,
    ROOT,
    STRANGER,
    SecureCluster,
    bearer,
    token,
)
from tests.waiting import wait_until
from tests.wsframes import next_frame

T1 = "persistent://acme/orders/t1"
TOPICS = "/admin/v2/persistent/acme/orders"


def _replace(path: Path, content: str | bytes) -> None:
    """Rewrite ``path`` as a Secret update does: a new file moved into place."""
    new = path.with_name(path.name + ".new")
    if isinstance(content, str):
        new.write_text(content)
    else:
        new.write_bytes(content)
    os.replace(new, path)


def _live(cluster: SecureCluster) -> LiveCredentials:
    live = cluster.broker.settings.auth.credentials
    assert live is not None
    return live


def _policy(**roles: list[dict[str, Any]]) -> str:
    policy = copy.deepcopy(POLICY)
    policy["roles"].update(roles)
    return yaml.safe_dump(policy)


async def _status(cluster: SecureCluster, path: str, value: str) -> int:
    async with (
        aiohttp.ClientSession() as http,
        http.get(cluster.url + path, headers=bearer(value)) as answer,
    ):
        return answer.status


async def _reloaded(cluster: SecureCluster, reloads: int) -> None:
    live = _live(cluster)
    await wait_until(lambda: live.reloads >= reloads, what=f"reload {reloads}")


async def test_a_new_policy_applies_to_new_requests(secure: SecureCluster) -> None:
    assert await _status(secure, TOPICS, token(STRANGER)) == 403
    grant = [{"resource": "acme/*", "actions": ["consume"]}]
    _replace(secure.files / "policy.yaml", _policy(**{STRANGER: grant}))
    await _reloaded(secure, 1)
    assert await _status(secure, TOPICS, token(STRANGER)) == 200
    # the coordinator shares the credentials (one set per process), so it applies there too
    assert secure.coordinator.settings.auth.policy is _live(secure).current.policy


async def test_a_revoked_right_refuses_the_frames_of_an_open_consumer(
    secure: SecureCluster,
) -> None:
    async with Client(secure.url, token=token(ROOT)) as root:
        await root.admin.create_topic(T1)
        await root.admin.create_subscription(T1, "s1", initial_position="earliest")
        producer = await root.create_producer(T1)
        await producer.send(b"one")
    url = f"{secure.url}/ws/v2/consumer/persistent/acme/orders/t1/s1?name=c1"
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(url, headers=bearer(token(CONSUMER))) as ws,
    ):
        assert isinstance(await next_frame(ws), frames.ConsumerReady)
        _replace(secure.files / "policy.yaml", _policy(**{CONSUMER: []}))
        await _reloaded(secure, 1)
        await ws.send_bytes(frames.encode(frames.Flow(permits=10)))
        refused = await next_frame(ws)
        assert isinstance(refused, frames.Error) and refused.error == "NotAuthorized"
        assert CONSUMER in refused.message
        await ws.send_bytes(
            frames.encode(frames.Ack(message_ids=[(1, 0)], request_id=7, cumulative=False))
        )
        refused = await next_frame(ws)
        assert isinstance(refused, frames.Error) and refused.request_id == 7
    async with Client(secure.url, token=token(ROOT)) as root:  # nothing was delivered or acked
        stats = await root.admin.stats(T1)
        s1 = stats["subscriptions"]["s1"]
        assert (s1["backlog"], s1["msgOutCounter"]) == (1, 0), s1


async def test_a_revoked_right_refuses_the_frames_of_an_open_reader(
    secure: SecureCluster,
) -> None:
    async with Client(secure.url, token=token(ROOT)) as root:
        await root.admin.create_topic(T1)
    url = f"{secure.url}/ws/v2/reader/persistent/acme/orders/t1?start=earliest"
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(url, headers=bearer(token(CONSUMER))) as ws,
    ):
        # only the pattern "app-*": a reader needs consume on every subscription
        restricted = [{"resource": "acme/*", "actions": ["consume"], "subscriptions": ["app-*"]}]
        _replace(secure.files / "policy.yaml", _policy(**{CONSUMER: restricted}))
        await _reloaded(secure, 1)
        await ws.send_bytes(frames.encode(frames.Flow(permits=10)))
        refused = await next_frame(ws)
        assert isinstance(refused, frames.Error) and refused.error == "NotAuthorized"
        assert "without a subscription" in refused.message


async def test_a_new_key_and_cluster_token_are_used_together(secure: SecureCluster) -> None:
    topic = "persistent://acme/orders/rotated"
    _replace(secure.files / "secret", OTHER_SECRET)
    _replace(secure.files / "cluster-token", token(CLUSTER, key=OTHER_SECRET))
    await _reloaded(secure, 1)
    assert await _status(secure, TOPICS, token(CONSUMER)) == 401  # the old key's
    assert await _status(secure, TOPICS, token(CONSUMER, key=OTHER_SECRET)) == 200
    # a v4 commit: coordinator -> broker (END) and broker -> coordinator (admission), each
    # with the cluster token the servers now hold
    async with Client(secure.url, token=token(ROOT, key=OTHER_SECRET)) as client:
        await client.admin.create_topic(topic)
        producer = await client.create_producer(topic)
        consumer = await client.subscribe(topic, "s", initial_position="earliest")
        txn = await client.transaction().start("v4")
        await producer.send(b"after-rotation", txn=txn)
        await txn.commit()
        assert (await consumer.receive(timeout_s=20)).value == b"after-rotation"


@pytest.mark.parametrize(
    ("file", "content", "says"),
    [
        ("policy.yaml", "roles: [", "not YAML"),
        ("policy.yaml", _policy(**{CONSUMER: [{"resource": "acme", "actions": ["consume"]}]}),
         "roles.orders-consumer[0]"),
        ("secret", b"short", "at least 32 bytes"),
        ("secret", OTHER_SECRET, "cluster-token"),  # the cluster token no longer verifies
        # made when the test runs: a token made at collection could expire before it does
        ("cluster-token", lambda: token(STRANGER), "superusers"),
    ],
    ids=["not-yaml", "bad-grant", "weak-secret", "key-without-token", "token-not-superuser"],
)  # fmt: skip
async def test_a_broken_new_set_is_refused_and_the_old_one_kept(
    secure: SecureCluster,
    caplog: pytest.LogCaptureFixture,
    file: str,
    content: str | bytes | Callable[[], str],
    says: str,
) -> None:
    live = _live(secure)
    before = live.current
    with caplog.at_level(logging.WARNING, logger="segtxn.auth.credentials"):
        _replace(secure.files / file, content() if callable(content) else content)
        await wait_until(lambda: live.refusals >= 1, what="the refusal")
    assert live.current is before and live.reloads == 0
    lines = [r.getMessage() for r in caplog.records if "refused the new security" in r.getMessage()]
    assert len(lines) == 1 and says in lines[0], lines  # once, not at every check
    assert await _status(secure, TOPICS, token(CONSUMER)) == 200  # the old set in force
    async with Client(secure.url, token=token(ROOT)) as client:  # the cluster role's calls too
        txn = await client.transaction().start("v4")
        await txn.commit()
