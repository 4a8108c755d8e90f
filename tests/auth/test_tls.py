"""TLS on the listeners, with certificates made here (tests/auth/certs.py): the client
verifies servers (an unknown CA and an expired certificate are each a CertificateError that
says so, at once, not a retry until the time limit), servers verify each other on their
own calls (v4 transactions go coordinator to broker and back), a new certificate is picked
up without a restart, and a server that requires client certificates gets them."""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from click.testing import CliRunner, Result

from segtxn.auth import AuthSettings, TlsSettings
from segtxn.broker.app import BrokerServer
from segtxn.broker.settings import BrokerSettings
from segtxn.cli.commands import main
from segtxn.client import CertificateError, Client, ErrorName, ServerError
from segtxn.coordinator.app import V4, CoordinatorServer
from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.metastore import MetadataStore, open_store
from tests.auth.certs import Authority, authority, issue
from tests.cluster import V4_IDS, start_on_free_ports
from tests.waiting import wait_until

BOTH_LOOPS = True
"""Each test runs on asyncio's loop and on uvloop (tests/auth/conftest.py)."""


@dataclass
class TlsCluster:
    store: MetadataStore
    broker: BrokerServer
    coordinator: CoordinatorServer
    ca: Authority
    cert: Path
    key: Path

    @property
    def url(self) -> str:
        return self.broker.settings.advertise_url


async def _start(
    tmp_path: Path, ca: Authority, cert: Path, key: Path, client_ca: Path | None = None
) -> TlsCluster:
    tls = TlsSettings(cert, key, ca.path, client_ca, reload_check_s=0.05)
    auth = AuthSettings.from_files(tls=tls)
    store = open_store("memory://")

    def servers(port: int, txn_port: int) -> tuple[BrokerServer, CoordinatorServer]:
        broker = BrokerServer(
            BrokerSettings(
                broker_id="b1",
                advertise_url=f"https://127.0.0.1:{port}",
                ledger_url=f"file://{tmp_path / 'ledgers'}",
                auth=auth,
            ),
            store=store,
        )
        coordinator = CoordinatorServer(
            CoordinatorSettings(
                advertise_url=f"https://127.0.0.1:{txn_port}",
                v4_coordinator_ids=V4_IDS,
                ledger_url=f"file://{tmp_path / 'txn-logs'}",
                fan_out_timeout_s=2.0,
                auth=auth,
            ),
            store=store,
        )
        return broker, coordinator

    broker, coordinator = await start_on_free_ports(servers)
    async with asyncio.timeout(10):
        await coordinator.coordinator.ready.wait()
    v4 = coordinator.app[V4]
    await wait_until(lambda: len(v4.held) == V4_IDS, timeout=10, what="the v4 ids recovered")
    return TlsCluster(store, broker, coordinator, ca, cert, key)


async def _stop(cluster: TlsCluster) -> None:
    await cluster.coordinator.stop()
    await cluster.broker.stop()
    await cluster.store.close()


@pytest.fixture
async def tls(tmp_path: Path) -> AsyncIterator[TlsCluster]:
    ca = authority(tmp_path, "cluster-ca")
    cert, key = issue(ca, tmp_path, "server")
    cluster = await _start(tmp_path, ca, cert, key)
    try:
        yield cluster
    finally:
        await _stop(cluster)


async def test_a_client_that_trusts_the_ca_does_v4_transactions(tls: TlsCluster) -> None:
    topic = "persistent://acme/tls/t"
    async with Client(tls.url, tls_ca=tls.ca.path) as client:
        await client.admin.create_topic(topic)
        producer = await client.create_producer(topic)
        consumer = await client.subscribe(topic, "s", initial_position="earliest")
        txn = await client.transaction().start("v4")
        await producer.send(b"over-tls", txn=txn)
        await txn.commit()  # coordinator -> broker, and broker -> coordinator, over TLS
        assert (await consumer.receive(timeout_s=20)).value == b"over-tls"


async def _refused(url: str, tls_ca: Path | None = None) -> str:
    """The CertificateError a client gets, well before its 20 s limit."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with Client(url, operation_timeout_s=20, tls_ca=tls_ca) as client:
        with pytest.raises(CertificateError) as caught:
            await client.create_producer("persistent://acme/tls/t")
        with pytest.raises(CertificateError):
            await client.admin.list_topics("persistent", "acme", "tls")
    assert loop.time() - started < 10, "a certificate error is not worth retrying"
    return str(caught.value)


async def test_a_server_signed_by_an_unknown_ca_is_refused(tls: TlsCluster, tmp_path: Path) -> None:
    stranger = authority(tmp_path, "stranger-ca")
    message = await _refused(tls.url, tls_ca=stranger.path)
    assert "certificate does not verify" in message and "issuer" in message, message
    assert "certificate does not verify" in await _refused(tls.url)  # the system's CAs: no


async def test_https_to_a_plain_http_server_says_it_does_not_speak_tls() -> None:
    runner = web.AppRunner(web.Application())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        message = await _refused(f"https://127.0.0.1:{port}")
    finally:
        await runner.cleanup()
    assert "the server does not speak TLS there (is it an http:// URL?)" in message, message


async def test_an_expired_server_certificate_is_said_clearly(tmp_path: Path) -> None:
    ca = authority(tmp_path, "cluster-ca")
    cert, key = issue(ca, tmp_path, "expired", expired=True)
    cluster = await _start(tmp_path, ca, cert, key)
    try:
        message = await _refused(cluster.url, tls_ca=ca.path)
        assert "certificate has expired" in message, message
    finally:
        await _stop(cluster)


async def test_a_new_certificate_is_served_without_a_restart(
    tls: TlsCluster, tmp_path: Path
) -> None:
    certificate = tls.broker.certificate
    assert certificate is not None
    renewed = authority(tmp_path, "renewed-ca")
    cert, key = issue(renewed, tmp_path, "renewed")
    for new, old in ((key, tls.key), (cert, tls.cert)):  # as a Secret update: one at a time
        shutil.copyfile(new, old.with_suffix(".tmp"))
        os.replace(old.with_suffix(".tmp"), old)
    await wait_until(lambda: certificate.reloads >= 1, timeout=10, what="the reload")
    await _refused(tls.url, tls_ca=tls.ca.path)  # the old CA no longer verifies it
    async with Client(tls.url, tls_ca=renewed.path) as client:
        await client.admin.create_topic("persistent://acme/tls/renewed")


async def test_a_broken_pair_keeps_the_old_certificate(tls: TlsCluster) -> None:
    certificate = tls.broker.certificate
    assert certificate is not None
    tls.key.write_bytes(b"not a key")
    assert certificate.check() is False  # logged; the old one stays
    async with Client(tls.url, tls_ca=tls.ca.path) as client:
        await client.admin.create_topic("persistent://acme/tls/still")


async def test_client_certificates_when_the_server_requires_them(tmp_path: Path) -> None:
    ca = authority(tmp_path, "cluster-ca")
    cert, key = issue(ca, tmp_path, "server")
    cluster = await _start(tmp_path, ca, cert, key, client_ca=ca.path)
    client_cert, client_key = issue(ca, tmp_path, "client")
    try:
        async with Client(
            cluster.url, tls_ca=ca.path, tls_cert=client_cert, tls_key=client_key
        ) as client:
            await client.admin.create_topic("persistent://acme/tls/mtls")
            txn = await client.transaction().start("v4")  # servers present theirs too
            await txn.commit()
        async with Client(cluster.url, tls_ca=ca.path, operation_timeout_s=5) as anonymous:
            # No certificate: refused at once, saying why (not a dropped connection)
            with pytest.raises(ServerError) as caught:
                await anonymous.admin.list_topics("persistent", "acme", "tls")
            assert caught.value.name is ErrorName.UNAUTHENTICATED
            assert "client certificate is required" in str(caught.value)
            with pytest.raises(ServerError) as ws_caught:  # a WebSocket upgrade too
                await anonymous.create_producer("persistent://acme/tls/mtls")
            assert ws_caught.value.name is ErrorName.UNAUTHENTICATED
        # The kubelet's probes present none, and pass; so does an open /metrics.
        context = ssl.create_default_context(cafile=ca.path)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as probe:
            for server in (cluster.url, cluster.coordinator.settings.advertise_url):
                for path in ("/healthz", "/readyz", "/metrics"):
                    async with probe.get(server + path) as response:
                        assert response.status == 200, (server, path, await response.text())
        # A certificate of another CA fails the handshake itself.
        stranger = authority(tmp_path, "stranger-ca")
        other_cert, other_key = issue(stranger, tmp_path, "stranger")
        async with Client(
            cluster.url, tls_ca=ca.path, tls_cert=other_cert, tls_key=other_key,
            operation_timeout_s=2,
        ) as impostor:  # fmt: skip
            with pytest.raises(ServerError) as refused:
                await impostor.admin.list_topics("persistent", "acme", "tls")
            assert refused.value.name is not ErrorName.UNAUTHENTICATED  # never reached HTTP
    finally:
        await _stop(cluster)


async def test_the_cli_verifies_with_tls_ca(tls: TlsCluster) -> None:
    runner = CliRunner()
    create = ["topics", "create", "--url", tls.url, "persistent://acme/tls/cli"]

    def cli(*args: str) -> Callable[[], Result]:
        return lambda: runner.invoke(main, list(args))

    refused = await asyncio.to_thread(cli(*create))
    assert refused.exit_code == 1 and "certificate does not verify" in refused.output
    done = await asyncio.to_thread(cli("--tls-ca", str(tls.ca.path), *create))
    assert done.exit_code == 0, done.output


def test_tls_flags_that_cannot_work_are_usage_errors(tmp_path: Path) -> None:
    ca = authority(tmp_path, "ca")
    cert, key = issue(ca, tmp_path, "server")
    broker = ["broker", "--store", "memory://", "--data-dir", str(tmp_path / "d")]
    runner = CliRunner()
    only_cert = runner.invoke(main, ["standalone", "--tls-cert", str(cert)])
    assert only_cert.exit_code == 2 and "both a certificate" in only_cert.output
    http = runner.invoke(
        main, [*broker, "--advertise", "http://127.0.0.1:9", "--tls-cert", str(cert),
               "--tls-key", str(key)]
    )  # fmt: skip
    assert http.exit_code == 2 and "must be a https:// URL" in http.output, http.output
    mismatch = runner.invoke(main, ["standalone", "--tls-cert", str(cert), "--tls-key", str(cert)])
    assert mismatch.exit_code == 2 and "not a certificate and its key" in mismatch.output
