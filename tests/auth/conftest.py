"""Fixtures for the security tests: keys made here with ``cryptography``, tokens signed with
them, a policy file, and a secured cluster (a broker with replication on, so its replica
routes exist, and a coordinator with v4 ids) on the embedded store."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
import pytest
import uvloop
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from segtxn.auth import AuthSettings
from segtxn.broker.app import BrokerServer
from segtxn.broker.settings import BrokerSettings
from segtxn.coordinator.app import V4, CoordinatorServer
from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.ledger.replicas import Replication
from segtxn.metastore import MetadataStore, open_store
from tests.cluster import V4_IDS, start_on_free_ports
from tests.waiting import wait_until


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Modules with ``BOTH_LOOPS = True`` run each test on asyncio's loop and on uvloop,
    the two a server process may run on (segtxn/cli/loops.py): TLS handshakes and the SNI
    hand-over of reloaded certificates go through each loop's own SSL code. The others run
    on asyncio's loop only (pytest-asyncio wants a mapping for every test here)."""
    factories: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
        "asyncio": asyncio.new_event_loop
    }
    if getattr(getattr(item, "module", None), "BOTH_LOOPS", False):
        factories["uvloop"] = uvloop.new_event_loop
    return factories


SECRET = b"s" * 40
OTHER_SECRET = b"o" * 40

CLUSTER = "segtxn-cluster"
ROOT = "root"
PRODUCER = "orders-producer"
CONSUMER = "orders-consumer"
ADMIN = "acme-admin"
OPS = "ops"
STRANGER = "stranger"
"""A role the policy names with rights elsewhere only (``other/ns``)."""
PRODUCER_2 = "orders-producer-2"
"""A second role with the same rights as PRODUCER (another role's transaction)."""
APP = "orders-app"
"""Consumes on acme/orders in its own subscriptions only (``app-*``)."""

POLICY: dict[str, Any] = {
    "superusers": [CLUSTER, ROOT],
    "roles": {
        PRODUCER: [{"resource": "acme/orders", "actions": ["produce"]}],
        PRODUCER_2: [{"resource": "acme/orders", "actions": ["produce", "consume"]}],
        CONSUMER: [{"resource": "acme/*", "actions": ["consume"]}],
        ADMIN: [{"resource": "acme/*", "actions": ["admin"]}],
        OPS: [{"resource": "*", "actions": ["admin"]}],
        STRANGER: [{"resource": "other/ns", "actions": ["produce", "consume", "admin"]}],
        APP: [
            {
                "resource": "acme/orders",
                "actions": ["produce", "consume"],
                "subscriptions": ["app-*"],
            }
        ],
    },
}


def token(role: str, *, key: Any = SECRET, algorithm: str = "HS256", ttl_s: float = 600) -> str:
    """A token for ``role`` that expires ``ttl_s`` from now (negative: already expired)."""
    return jwt.encode({"sub": role, "exp": int(time.time() + ttl_s)}, key, algorithm=algorithm)


def bearer(value: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {value}"}


def write_policy(path: Path, policy: dict[str, Any] | None = None) -> Path:
    path.write_text(yaml.safe_dump(policy or POLICY))
    return path


RELOAD_CHECK_S = 0.05
"""How often the test servers look for new security files (tests/auth/test_reload.py)."""


def auth_settings(tmp_path: Path) -> AuthSettings:
    """HS256 with :data:`SECRET`, :data:`POLICY`, the cluster role's token (files in
    ``tmp_path``: ``secret``, ``policy.yaml``, ``cluster-token``, checked for changes every
    :data:`RELOAD_CHECK_S`)."""
    (tmp_path / "secret").write_bytes(SECRET + b"\n")
    (tmp_path / "cluster-token").write_text(token(CLUSTER, ttl_s=3600) + "\n")
    return AuthSettings.from_files(
        secret_file=tmp_path / "secret",
        policy_file=write_policy(tmp_path / "policy.yaml"),
        cluster_token_file=tmp_path / "cluster-token",
        reload_check_s=RELOAD_CHECK_S,
    )


@dataclass(frozen=True)
class KeyPair:
    private: Any
    public_pem: bytes


def rsa_pair() -> KeyPair:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return KeyPair(key, _pem(key.public_key()))


def ec_pair() -> KeyPair:
    key = ec.generate_private_key(ec.SECP256R1())
    return KeyPair(key, _pem(key.public_key()))


def _pem(public: Any) -> bytes:
    return bytes(
        public.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


@dataclass
class SecureCluster:
    store: MetadataStore
    broker: BrokerServer
    coordinator: CoordinatorServer
    files: Path
    """Where the security files are (:func:`auth_settings`)."""

    @property
    def url(self) -> str:
        return self.broker.settings.advertise_url

    @property
    def txn_url(self) -> str:
        return self.coordinator.settings.advertise_url


@pytest.fixture
async def secure(tmp_path: Path) -> AsyncIterator[SecureCluster]:
    """A broker and a coordinator with security on (:func:`auth_settings`)."""
    auth = auth_settings(tmp_path)
    store = open_store("memory://")

    def servers(port: int, txn_port: int) -> tuple[BrokerServer, CoordinatorServer]:
        broker = BrokerServer(
            BrokerSettings(
                broker_id="b1",
                advertise_url=f"http://127.0.0.1:{port}",
                ledger_url=f"file://{tmp_path / 'ledgers'}",
                replication=Replication(write_quorum=1, ack_quorum=1),
                consumer_hold_s=1.0,
                auth=auth,
            ),
            store=store,
        )
        coordinator = CoordinatorServer(
            CoordinatorSettings(
                advertise_url=f"http://127.0.0.1:{txn_port}",
                timeout_sweep_s=0.1,
                gc_sweep_s=3600,
                v4_coordinator_ids=V4_IDS,
                ledger_url=f"file://{tmp_path / 'txn-logs'}",
                fan_out_timeout_s=2.0,
                auth=auth,
            ),
            store=store,
        )
        return broker, coordinator

    broker, coordinator = await start_on_free_ports(servers)
    v4 = coordinator.app[V4]
    async with asyncio.timeout(10):
        await coordinator.coordinator.ready.wait()
    await wait_until(lambda: len(v4.held) == V4_IDS, timeout=10, what="the v4 ids recovered")
    try:
        yield SecureCluster(store, broker, coordinator, tmp_path)
    finally:
        await coordinator.stop()
        await broker.stop()
        await store.close()
