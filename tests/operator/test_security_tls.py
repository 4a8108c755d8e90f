"""What the operator issues for a secured cluster works on real servers: its Secrets,
written out as the kubelet mounts them, start a real broker and coordinator with TLS and
tokens; the segtxn client verifies them with the cluster's CA and a role's token, the
operator's own calls go through with the admin token, and host names are checked against
the certificates' names (the Kubernetes names resolved here to 127.0.0.1)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import socket
import ssl
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import kopf
import pytest
from aiohttp.abc import AbstractResolver, ResolveResult

from segtxn.auth import AuthSettings, TlsSettings
from segtxn.broker.app import BrokerServer
from segtxn.broker.settings import BrokerSettings
from segtxn.client import Client, NotAuthorized, Unauthenticated
from segtxn.client.connection import Connector
from segtxn.coordinator.app import CoordinatorServer
from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.metastore import InvalidArgument, StoreCredentials, open_store
from segtxn.metastore.etcd_credentials import LiveCredentials
from segtxn.operator import pki, sessions
from segtxn.operator.kube import Kube
from segtxn.operator.runtime import OperatorConfig, Runtime, admin
from segtxn.protocol.auth import client_ssl_context
from tests.cluster import start_on_free_ports
from tests.operator.emulator import NS, Emulator, emulator, operator
from tests.operator.support import WAIT_S, config_of, offline
from tests.operator.test_security import ALL_SECRETS, secured
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)
TOPIC = "persistent://acme/orders/tls"


def mount(emu: Emulator, secret: str, into: Path) -> Path:
    """Write a Secret's keys as files, as a pod's secret volume holds them."""
    found = emu.get("v1/secrets", secret)
    assert found is not None, secret
    into.mkdir(parents=True)
    for key, value in found["data"].items():
        (into / key).write_bytes(base64.b64decode(value))
    return into


class Names(AbstractResolver):
    """Every name resolves to 127.0.0.1: the cluster's DNS names reach the test's servers."""

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return [{"hostname": host, "host": "127.0.0.1", "port": port, "family": socket.AF_INET,
                 "proto": 0, "flags": socket.AI_NUMERICHOST}]  # fmt: skip

    async def close(self) -> None:
        return None


async def healthz(url: str, ca: Path) -> int:
    connector = aiohttp.TCPConnector(ssl=client_ssl_context(ca), resolver=Names())
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.get(f"{url}/healthz") as response,
    ):
        return response.status


@pytest.fixture
async def issued(tmp_path: Path) -> AsyncIterator[tuple[Emulator, dict[str, Path]]]:
    """The operator's Secrets for cluster ``demo`` (and its coordinators), mounted."""
    async with issue(tmp_path) as found:
        yield found


@contextlib.asynccontextmanager
async def issue(tmp_path: Path, **extra: Any) -> AsyncIterator[tuple[Emulator, dict[str, Path]]]:
    """:func:`issued` with ``extra`` in ``spec.security``."""
    async with emulator() as emu:
        async with operator(emu, offline()):
            await secured(emu, **extra)
            await wait_until(
                lambda: (
                    all(emu.get("v1/secrets", s) for s in ALL_SECRETS)
                    and config_of(emu) is not None
                    and emu.get("apps/v1/statefulsets", "demo-broker") is not None
                    and emu.get("apps/v1/deployments", "demo-coordinator") is not None
                ),
                timeout=WAIT_S,
                what="the Secrets, the brokers' ConfigMap and both workloads",
            )
        config = config_of(emu)
        assert config is not None
        files = {
            "tls": mount(emu, "demo-broker-tls", tmp_path / "tls"),
            "coordinator-tls": mount(emu, "demo-coordinator-tls", tmp_path / "ctls"),
            "auth": mount(emu, "demo-auth", tmp_path / "auth"),
            "orders-app": mount(emu, "demo-token-orders-app", tmp_path / "orders-app"),
            "admin": mount(emu, "demo-token-segtxn-admin", tmp_path / "admin"),
        }
        files["policy"] = tmp_path / "policy.yaml"
        files["policy"].write_text(config["data"]["policy.yaml"])
        yield emu, files


def settings(files: dict[str, Path], tls: str, client_ca: bool = False) -> AuthSettings:
    certs = files[tls]
    client = certs / "ca.crt" if client_ca else None
    return AuthSettings.from_files(
        public_key_file=files["auth"] / "public.pem",
        policy_file=files["policy"],
        cluster_token_file=files["auth"] / "cluster.jwt",
        tls=TlsSettings(certs / "tls.crt", certs / "tls.key", certs / "ca.crt", client),
    )


async def test_the_operators_certificates_and_tokens_serve_tls_to_the_client(
    issued: tuple[Emulator, dict[str, Path]], tmp_path: Path
) -> None:
    emu, files = issued
    store = open_store("memory://")

    def servers(port: int, txn_port: int) -> tuple[BrokerServer, CoordinatorServer]:
        broker = BrokerServer(
            BrokerSettings(
                broker_id="demo-broker-0",
                advertise_url=f"https://localhost:{port}",  # a name the certificate has
                ledger_url=f"file://{tmp_path / 'ledgers'}",
                auth=settings(files, "tls"),
            ),
            store=store,
        )
        coordinator = CoordinatorServer(
            CoordinatorSettings(
                advertise_url=f"https://10-0-0-7.{NS}.pod:{txn_port}",
                auth=settings(files, "coordinator-tls"),
            ),
            host="127.0.0.1",
            store=store,
        )
        return broker, coordinator

    broker, coordinator = await start_on_free_ports(servers)
    try:
        ca = files["tls"] / "ca.crt"
        url = broker.settings.advertise_url
        app_token = (files["orders-app"] / "token").read_text()
        # The operator's own calls: TLS with the cluster's CA (from the admin token's
        # Secret), the admin token (admin on '*').
        kube = Kube(kopf.ConnectionInfo(server=str(emu.url), insecure=True))
        async with aiohttp.ClientSession() as plain:
            runtime = Runtime(OperatorConfig(broker_url=url), kube, plain)
            try:
                brokers = await admin(runtime, NS, "demo")
                await brokers.create_topic(TOPIC)
                assert (await brokers.broker_homes("demo-broker-0")).homes == [TOPIC]
            finally:
                await runtime.sessions.close()
                await kube.close()
        # A role's token and the CA from its Secret: the client verifies the broker.
        async with Client(url, token=app_token, tls_ca=files["orders-app"] / "ca.crt") as client:
            producer = await client.create_producer(TOPIC)
            consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
            await producer.send(b"issued by the operator")
            assert (await consumer.receive(timeout_s=20)).value == b"issued by the operator"
        # The admin role administers; it does not produce.
        admin_token = (files["admin"] / "token").read_text()
        async with Client(url, token=admin_token, tls_ca=ca) as client:
            with pytest.raises(NotAuthorized):
                await client.create_producer(TOPIC)
        # Host names: the Services' and pods' names are in the certificates, others not.
        port = url.rsplit(":", 1)[1]
        for name in (f"demo-broker.{NS}.svc", f"demo-broker-0.demo-broker-headless.{NS}.svc"):
            assert await healthz(f"https://{name}:{port}", ca) == 200
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await healthz(f"https://elsewhere.{NS}.svc:{port}", ca)
        coordinator_url = coordinator.settings.advertise_url
        assert await healthz(coordinator_url, ca) == 200
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=client_ssl_context(ca), resolver=Names()),
            headers={"Authorization": f"Bearer {admin_token}"},
        ) as session:
            stats: Any = await Connector(coordinator_url, session).request("GET", "/txn/v2/stats")
            assert stats["openTransactions"] == 0
    finally:
        await asyncio.gather(coordinator.stop(), broker.stop())
        await store.close()


async def test_with_client_certificates_every_caller_presents_one_but_the_probes(
    tmp_path: Path,
) -> None:
    """``clientCertificates``: the servers get ``--tls-client-ca``; each role's Secret a
    certificate naming it; the operator's calls and a role's client go through with theirs,
    a caller without one is refused saying so, the kubelet's probes pass without."""
    async with issue(tmp_path, clientCertificates=True) as (emu, files):
        for workload in ("apps/v1/statefulsets", "apps/v1/deployments"):
            found = emu.get(
                workload, "demo-broker" if "stateful" in workload else "demo-coordinator"
            )
            assert found is not None
            args = found["spec"]["template"]["spec"]["containers"][0]["args"]
            assert "--tls-client-ca=/etc/segtxn/tls/ca.crt" in args
        ca = files["tls"] / "ca.crt"
        for role in ("orders-app", "admin"):
            cert = (files[role] / "tls.crt").read_bytes()
            assert pki.signed_by(cert, ca.read_bytes())
            assert pki.common_name_of(cert) == ("segtxn-admin" if role == "admin" else role)
        store = open_store("memory://")

        def servers(port: int, txn_port: int) -> tuple[BrokerServer, CoordinatorServer]:
            broker = BrokerServer(
                BrokerSettings(
                    broker_id="demo-broker-0",
                    advertise_url=f"https://localhost:{port}",
                    ledger_url=f"file://{tmp_path / 'ledgers'}",
                    auth=settings(files, "tls", client_ca=True),
                ),
                store=store,
            )
            coordinator = CoordinatorServer(
                CoordinatorSettings(
                    advertise_url=f"https://10-0-0-7.{NS}.pod:{txn_port}",
                    auth=settings(files, "coordinator-tls", client_ca=True),
                ),
                host="127.0.0.1",
                store=store,
            )
            return broker, coordinator

        broker, coordinator = await start_on_free_ports(servers)
        try:
            url = broker.settings.advertise_url
            kube = Kube(kopf.ConnectionInfo(server=str(emu.url), insecure=True))
            async with aiohttp.ClientSession() as plain:
                runtime = Runtime(OperatorConfig(broker_url=url), kube, plain)
                try:
                    await (await admin(runtime, NS, "demo")).create_topic(TOPIC)
                finally:
                    await runtime.sessions.close()
                    await kube.close()
            app = files["orders-app"]
            token = (app / "token").read_text()
            async with Client(
                url, token=token, tls_ca=ca, tls_cert=app / "tls.crt", tls_key=app / "tls.key"
            ) as client:
                producer = await client.create_producer(TOPIC)
                consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
                await producer.send(b"mutual")
                assert (await consumer.receive(timeout_s=20)).value == b"mutual"
            async with Client(url, token=token, tls_ca=ca) as anonymous:
                with pytest.raises(Unauthenticated, match="client certificate is required"):
                    await anonymous.admin.list_topics("persistent", "acme", "orders")
            # The kubelet's HTTPS probes present no certificate.
            assert await healthz(url, ca) == 200
            assert await healthz(coordinator.settings.advertise_url, ca) == 200
        finally:
            await asyncio.gather(coordinator.stop(), broker.stop())
            await store.close()


def test_client_certificates_load_without_a_writable_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator's root filesystem is read-only (and the servers'): loading the admin
    role's client certificate, or checking the store's client pair, must not need a
    temporary file."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-directory"))
    ca = pki.new_ca("test CA", datetime.datetime.now(datetime.UTC))
    issued = pki.issue_client(ca, "segtxn-admin", datetime.datetime.now(datetime.UTC), 2)
    context = ssl.create_default_context(cadata=ca.cert_pem.decode())
    sessions._load_client_certificate(context, issued.cert_pem.decode(), issued.key_pem.decode())
    other = pki.issue_client(ca, "other", datetime.datetime.now(datetime.UTC), 2)
    with pytest.raises(ssl.SSLError):
        sessions._load_client_certificate(context, issued.cert_pem.decode(), other.key_pem.decode())
    files = {}
    for name, data in (("ca", ca.cert_pem), ("crt", issued.cert_pem), ("key", issued.key_pem),
                       ("other", other.key_pem)):  # fmt: skip
        files[name] = tmp_path / name
        files[name].write_bytes(data)
    LiveCredentials(StoreCredentials(files["ca"], files["crt"], files["key"]))
    with pytest.raises(InvalidArgument, match="not a certificate and its key"):
        LiveCredentials(StoreCredentials(files["ca"], files["crt"], files["other"]))
