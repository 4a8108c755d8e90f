"""A client certificate's subject as its role (mTLS authentication): with ``cert_role``
set, a request without a token is authenticated by the certificate it presented (its CN,
or its first URI or e-mail alternative name, by the setting), and a token, when given,
wins. The matrix, for each setting: a certificate naming a role with the right (200), one
naming a role without it (403), one without the chosen part (401), and each with a token on
top (the token decides, an expired one included)."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from click.testing import CliRunner

from segtxn.auth import AuthConfigError, AuthSettings, CertRole, TlsSettings
from segtxn.auth.certroles import certificate_role
from segtxn.broker.app import BrokerServer
from segtxn.broker.settings import BrokerSettings
from segtxn.cli.commands import main
from segtxn.client import Client
from segtxn.coordinator.app import CoordinatorServer
from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.metastore import MetadataStore, open_store
from segtxn.protocol.auth import client_ssl_context
from segtxn.protocol.errors import ErrorName, ServerError
from tests.auth.certs import Authority, authority, issue
from tests.auth.conftest import CLUSTER, CONSUMER, POLICY, ROOT, SECRET, STRANGER, bearer, token
from tests.auth.conftest import write_policy as _write_policy
from tests.cluster import start_on_free_ports

TOPIC = "persistent://acme/orders/by-cert"
TOPICS = "/admin/v2/persistent/acme/orders"
"""Listing acme/orders' topics: any use of the namespace (CONSUMER yes, STRANGER no)."""


def named(source: CertRole, role: str) -> str:
    """What a certificate carries to name ``role`` under ``source``; the policy below
    names these too (a URI or an address is a role name like any other)."""
    if source is CertRole.URI:
        return f"spiffe://segtxn/{role}"
    if source is CertRole.EMAIL:
        return f"{role}@example.com"
    return role


def _fields(source: CertRole, role: str) -> dict[str, str]:
    if source is CertRole.CN:
        return {"name": role}
    return {"name": "nobody", source.value: named(source, role)}


@dataclass
class Mtls:
    store: MetadataStore
    broker: BrokerServer
    ca: Authority
    directory: Path
    source: CertRole

    @property
    def url(self) -> str:
        return self.broker.settings.advertise_url

    def files(self, **fields: str) -> tuple[Path, Path]:
        return issue(self.ca, self.directory, **fields)  # type: ignore[arg-type]

    def context_for(self, role: str) -> ssl.SSLContext:
        """A client context whose certificate names ``role`` under this setting."""
        cert, key = self.files(**_fields(self.source, role))
        return client_ssl_context(self.ca.path, cert, key)


def _settings(tmp_path: Path, ca: Authority, source: CertRole) -> AuthSettings:
    cert, key = issue(ca, tmp_path, "server")
    (tmp_path / "secret").write_bytes(SECRET)
    (tmp_path / "cluster-token").write_text(token(CLUSTER, ttl_s=3600))
    policy = dict(POLICY)
    policy["roles"] = {
        **POLICY["roles"],
        named(source, CONSUMER): POLICY["roles"][CONSUMER],
    }
    return AuthSettings.from_files(
        secret_file=tmp_path / "secret",
        policy_file=_write_policy(tmp_path / "policy.yaml", policy),
        cluster_token_file=tmp_path / "cluster-token",
        tls=TlsSettings(cert, key, ca.path, ca.path),
        cert_role=source,
    )


@pytest.fixture(params=list(CertRole), ids=[r.value for r in CertRole])
async def mtls(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Mtls]:
    ca = authority(tmp_path, "cluster-ca")
    auth = _settings(tmp_path, ca, request.param)
    store = open_store("memory://")

    def servers(port: int, txn_port: int) -> tuple[BrokerServer, CoordinatorServer]:
        broker = BrokerSettings(
            broker_id="b1",
            advertise_url=f"https://127.0.0.1:{port}",
            ledger_url=f"file://{tmp_path / 'ledgers'}",
            auth=auth,
        )
        coordinator = CoordinatorSettings(
            advertise_url=f"https://127.0.0.1:{txn_port}", v4_coordinator_ids=0, auth=auth
        )
        return BrokerServer(broker, store=store), CoordinatorServer(coordinator, store=store)

    broker, coordinator = await start_on_free_ports(servers)
    try:
        yield Mtls(store, broker, ca, tmp_path, request.param)
    finally:
        await coordinator.stop()
        await broker.stop()
        await store.close()


async def _get(
    mtls: Mtls, context: ssl.SSLContext, headers: dict[str, str] | None = None
) -> tuple[int, str | None, str]:
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as http,
        http.get(mtls.url + TOPICS, headers=headers or {}) as answer,
    ):
        return answer.status, answer.headers.get("X-Segtxn-Error"), await answer.text()


async def test_the_certificate_names_the_role_and_a_token_wins(mtls: Mtls) -> None:
    right, wrong = mtls.context_for(CONSUMER), mtls.context_for(STRANGER)
    assert (await _get(mtls, right))[:2] == (200, None)
    status, error, text = await _get(mtls, wrong)
    assert (status, error) == (403, "NotAuthorized"), text
    assert repr(named(mtls.source, STRANGER)) in text
    # a token wins over the certificate, either way, and an expired one is not passed over
    assert (await _get(mtls, right, bearer(token(STRANGER))))[:2] == (403, "NotAuthorized")
    assert (await _get(mtls, wrong, bearer(token(CONSUMER))))[:2] == (200, None)
    status, error, text = await _get(mtls, right, bearer(token(CONSUMER, ttl_s=-600)))
    assert (status, error) == (401, "Unauthenticated") and "expired" in text


async def test_a_certificate_without_the_part_is_unauthenticated(mtls: Mtls) -> None:
    # a CN but no URI or e-mail name; for the CN setting, a CN that is not a role name
    cert, key = mtls.files(name=CONSUMER if mtls.source is not CertRole.CN else f" {CONSUMER}")
    status, error, text = await _get(mtls, client_ssl_context(mtls.ca.path, cert, key))
    assert (status, error) == (401, "Unauthenticated"), text
    assert "has no usable" in text


async def test_a_client_consumes_with_its_certificate_alone(mtls: Mtls) -> None:
    cert, key = mtls.files(**_fields(mtls.source, CONSUMER))
    anyone, anyone_key = mtls.files(name="anyone")  # every client needs one; the token wins
    async with Client(
        mtls.url, tls_ca=mtls.ca.path, tls_cert=anyone, tls_key=anyone_key, token=token(ROOT)
    ) as root:
        await root.admin.create_topic(TOPIC)
        producer = await root.create_producer(TOPIC)
        await producer.send(b"by-certificate")
    async with Client(mtls.url, tls_ca=mtls.ca.path, tls_cert=cert, tls_key=key) as client:
        consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
        assert (await consumer.receive(timeout_s=20)).value == b"by-certificate"
        with pytest.raises(ServerError) as caught:  # CONSUMER may not produce
            await client.create_producer(TOPIC)
        assert caught.value.name is ErrorName.NOT_AUTHORIZED


def test_the_parts_of_a_peer_certificate() -> None:
    peer = {
        "subject": ((("countryName", "FR"),), (("commonName", "app"),)),
        "subjectAltName": (("DNS", "x"), ("URI", "spiffe://a/b"), ("email", "a@b.c")),
        "notAfter": "Jan  1 00:00:00 2030 GMT",
    }
    assert certificate_role(peer, CertRole.CN) == ("app", 1893456000.0)
    assert certificate_role(peer, CertRole.URI)[0] == "spiffe://a/b"
    assert certificate_role(peer, CertRole.EMAIL)[0] == "a@b.c"
    for missing, source in (({"subject": ()}, CertRole.CN), (None, CertRole.URI)):
        with pytest.raises(ServerError) as caught:
            certificate_role({**peer, **missing} if missing else None, source)
        assert caught.value.name is ErrorName.UNAUTHENTICATED


def test_certificate_roles_need_required_client_certificates(tmp_path: Path) -> None:
    ca = authority(tmp_path, "ca")
    cert, key = issue(ca, tmp_path, "server")
    (tmp_path / "secret").write_bytes(SECRET)
    (tmp_path / "cluster-token").write_text(token(CLUSTER))
    policy = _write_policy(tmp_path / "policy.yaml")
    with pytest.raises(AuthConfigError, match="--tls-client-ca"):
        AuthSettings.from_files(
            secret_file=tmp_path / "secret",
            policy_file=policy,
            cluster_token_file=tmp_path / "cluster-token",
            tls=TlsSettings(cert, key),
            cert_role=CertRole.CN,
        )
    with pytest.raises(AuthConfigError, match="without a token key"):
        AuthSettings.from_files(tls=TlsSettings(cert, key, None, ca.path), cert_role=CertRole.CN)
    result = CliRunner().invoke(
        main,
        ["standalone", "--tls-cert", str(cert), "--tls-key", str(key), "--auth-cert-role", "uri",
         "--auth-token-secret", str(tmp_path / "secret"), "--auth-policy",
         str(tmp_path / "policy.yaml"), "--auth-cluster-token", str(tmp_path / "cluster-token")],
    )  # fmt: skip
    assert result.exit_code == 2 and "--tls-client-ca" in result.output, result.output
