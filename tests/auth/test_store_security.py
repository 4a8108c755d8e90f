"""The metadata store connection with TLS and etcd's own authentication, against a real
etcd started here with TLS, client certificates required, and users: the matrix of client
credentials (a user and password, a certificate naming the user, a wrong password, a wrong
CA, no TLS, a user outside its permitted keys), a token etcd forgot, and a broker and a
coordinator running on that etcd with the ``--store-*`` settings."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from aetcd import rpc
from click.testing import CliRunner

from segtxn.broker.app import BrokerServer
from segtxn.broker.settings import BrokerSettings
from segtxn.cli.commands import main
from segtxn.client import Client
from segtxn.client import StoreAccessDenied as StoreAccessDeniedError
from segtxn.coordinator.app import CoordinatorServer
from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.metastore import (
    StoreAccessDenied,
    StoreCredentials,
    StoreSettings,
    StoreUnavailable,
    open_store,
)
from segtxn.metastore.etcd import EtcdEngine
from segtxn.metastore.etcd_server import EtcdServer, EtcdTls
from segtxn.metastore.keys import prefix_end
from tests.auth.certs import Authority, authority, issue
from tests.cluster import start_on_free_ports
from tests.waiting import wait_until

USER = "segtxn"
PASSWORD = "a-long-password"
PREFIX = "/segtxn"
"""The keys the etcd user may read and write (and nothing else)."""


@dataclass
class SecureEtcd:
    server: EtcdServer
    ca: Authority
    directory: Path
    client_cert: Path
    """A certificate whose CN names nobody in etcd (the password decides)."""
    client_key: Path
    password_file: Path

    def url(self, namespace: str) -> str:
        return self.server.url(f"{PREFIX}/{namespace}-{os.getpid()}")

    def credentials(self, **changes: object) -> StoreCredentials:
        """The right credentials, with ``changes``."""
        values: dict[str, object] = {
            "ca_file": self.ca.path,
            "cert_file": self.client_cert,
            "key_file": self.client_key,
            "user": USER,
            "password_file": self.password_file,
        }
        values.update(changes)
        return StoreCredentials(**values)  # type: ignore[arg-type]


async def _enable_auth(server: EtcdServer, tls: grpc.ChannelCredentials) -> None:
    """root and USER (read-write on PREFIX only), then etcd's authentication on."""
    async with grpc.aio.secure_channel(server.endpoint, tls) as channel:
        auth = rpc.AuthStub(channel)
        for user, password in (("root", "root-password"), (USER, PASSWORD)):
            await auth.UserAdd(rpc.AuthUserAddRequest(name=user, password=password))
            await auth.RoleAdd(rpc.AuthRoleAddRequest(name=user))
            await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user=user, role=user))
        permission = rpc.Permission(
            permType=rpc.Permission.READWRITE,
            key=PREFIX.encode(),
            range_end=prefix_end(PREFIX.encode()),
        )
        await auth.RoleGrantPermission(
            rpc.AuthRoleGrantPermissionRequest(name=USER, perm=permission)
        )
        await auth.AuthEnable(rpc.AuthEnableRequest())


@pytest.fixture(scope="module")
def secure_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureEtcd]:
    with running_secure_etcd(tmp_path_factory.mktemp("secure-etcd")) as etcd:
        yield etcd


@contextlib.contextmanager
def running_secure_etcd(directory: Path) -> Iterator[SecureEtcd]:
    """An etcd with TLS on its client port, client certificates required (signed by the
    test CA), and authentication on."""
    ca = authority(directory, "etcd-ca")
    cert, key = issue(ca, directory, "etcd-server")
    server = EtcdServer.in_temp_dir(unsafe_no_fsync=True, tls=EtcdTls(cert, key, ca.path))
    server.start()
    try:
        client_cert, client_key = issue(ca, directory, "nobody")
        pem = (ca.path.read_bytes(), client_key.read_bytes(), client_cert.read_bytes())
        asyncio.run(_enable_auth(server, grpc.ssl_channel_credentials(*pem)))
        password_file = directory / "password"
        password_file.write_text(PASSWORD + "\n")
        yield SecureEtcd(server, ca, directory, client_cert, client_key, password_file)
    finally:
        server.stop()


async def _round_trip(url: str, credentials: StoreCredentials, timeout_s: float = 5.0) -> None:
    """Create, read and delete a record through a store with ``credentials``."""
    store = open_store(url, StoreSettings(request_timeout_s=timeout_s, credentials=credentials))
    try:
        await store.put("/k", b"v")
        record = await store.get("/k")
        assert record is not None and record.value == b"v"
        await store.delete("/k")
    finally:
        await store.close()


async def test_a_user_and_password_over_tls(secure_etcd: SecureEtcd) -> None:
    await _round_trip(secure_etcd.url("password"), secure_etcd.credentials())


async def test_a_client_certificate_naming_the_user(secure_etcd: SecureEtcd) -> None:
    """etcd takes the user from a client certificate's CN when no token is sent."""
    cert, key = issue(secure_etcd.ca, secure_etcd.directory, USER)
    credentials = secure_etcd.credentials(
        cert_file=cert, key_file=key, user=None, password_file=None
    )
    await _round_trip(secure_etcd.url("by-cert"), credentials)


async def test_a_wrong_password_is_denied_at_once(secure_etcd: SecureEtcd, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-password")
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(StoreAccessDenied, match="authentication failed"):
        await _round_trip(secure_etcd.url("wrong"), secure_etcd.credentials(password_file=wrong))
    assert loop.time() - started < 5


async def test_keys_outside_the_users_permission_are_denied(secure_etcd: SecureEtcd) -> None:
    outside = secure_etcd.server.url(f"/elsewhere-{os.getpid()}")
    with pytest.raises(StoreAccessDenied, match="permission denied"):
        await _round_trip(outside, secure_etcd.credentials())


async def test_no_user_where_etcd_wants_one_says_so(secure_etcd: SecureEtcd) -> None:
    """The certificate's CN (``nobody``) is no etcd user, and no password is given."""
    with pytest.raises(StoreAccessDenied):
        await _round_trip(
            secure_etcd.url("nobody"), secure_etcd.credentials(user=None, password_file=None)
        )


@pytest.mark.parametrize("case", ["another CA", "no client certificate", "no TLS"])
async def test_a_connection_etcd_or_the_client_refuses_is_unavailable(
    secure_etcd: SecureEtcd, tmp_path: Path, case: str
) -> None:
    changes: dict[str, object] = {
        "another CA": {"ca_file": authority(tmp_path, "stranger").path},
        "no client certificate": {"cert_file": None, "key_file": None},
        "no TLS": {"ca_file": None, "cert_file": None, "key_file": None},
    }[case]  # type: ignore[assignment]
    with pytest.raises(StoreUnavailable):
        await _round_trip(secure_etcd.url("refused"), secure_etcd.credentials(**changes), 1.0)


async def test_a_token_etcd_forgot_is_renewed(secure_etcd: SecureEtcd) -> None:
    store = open_store(
        secure_etcd.url("renewed"), StoreSettings(credentials=secure_etcd.credentials())
    )
    try:
        await store.put("/k", b"1")
        engine = store.engine
        assert isinstance(engine, EtcdEngine)
        # as after --auth-token-ttl or on another member:
        engine.connection._token = "forgotten.by.etcd"
        await store.put("/k", b"2")  # refused once, authenticated again, made again
        record = await store.get("/k")
        assert record is not None and record.value == b"2"
        assert engine.connection._token != "forgotten.by.etcd"
    finally:
        await store.close()


@pytest.fixture
async def servers(secure_etcd: SecureEtcd, tmp_path: Path) -> AsyncIterator[str]:
    """A broker and a coordinator that open the secure etcd themselves."""
    url, credentials = secure_etcd.url("cluster"), secure_etcd.credentials()

    def make(port: int, txn_port: int) -> tuple[BrokerServer, CoordinatorServer]:
        broker = BrokerSettings(
            broker_id="b1",
            advertise_url=f"http://127.0.0.1:{port}",
            store_url=url,
            store_credentials=credentials,
            ledger_url=f"file://{tmp_path / 'ledgers'}",
        )
        coordinator = CoordinatorSettings(
            advertise_url=f"http://127.0.0.1:{txn_port}",
            store_url=url,
            store_credentials=credentials,
            v4_coordinator_ids=0,
        )
        return BrokerServer(broker), CoordinatorServer(coordinator)

    broker, coordinator = await start_on_free_ports(make)
    try:
        async with asyncio.timeout(20):
            await coordinator.coordinator.ready.wait()
        yield broker.settings.advertise_url
    finally:
        await coordinator.stop()
        await broker.stop()


async def test_servers_on_the_secure_store(servers: str) -> None:
    """Sessions (leases), watches and transactions all go over the secure connection."""
    topic = "topic://acme/orders/on-secure-etcd"
    async with Client(servers) as client:
        await client.admin.create_topic(topic, segments=2)
        producer = await client.create_producer(topic)
        consumer = await client.subscribe(topic, "s", initial_position="earliest")
        txn = await client.transaction().start()
        await producer.send(b"committed", key="k", txn=txn)
        await txn.commit()
        message = await consumer.receive(timeout_s=20)
        assert message.value == b"committed"


def test_store_flags_that_cannot_work_are_usage_errors(
    secure_etcd: SecureEtcd, tmp_path: Path
) -> None:
    runner = CliRunner()
    memory = runner.invoke(main, ["standalone", "--store-ca", str(secure_etcd.ca.path)])
    assert memory.exit_code == 2 and "etcd://" in memory.output, memory.output
    # on a port it picks and holds (advertised port 0): none another process could take first
    broker = ["broker", "--store", secure_etcd.url("cli"), "--data-dir", str(tmp_path / "d"),
              "--advertise", "http://127.0.0.1:0"]  # fmt: skip
    no_password = runner.invoke(main, [*broker, "--store-user", USER])
    assert no_password.exit_code == 2 and "password file" in no_password.output
    unreadable = runner.invoke(
        main, [*broker, "--store-user", USER, "--store-password-file", str(tmp_path / "none")]
    )
    assert unreadable.exit_code == 2 and "cannot be read" in unreadable.output
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-password\n")
    started = time.monotonic()
    denied = runner.invoke(
        main,
        [*broker, "--store-timeout", "60", "--store-user", USER,
         "--store-password-file", str(wrong), "--store-ca", str(secure_etcd.ca.path),
         "--store-cert", str(secure_etcd.client_cert), "--store-key", str(secure_etcd.client_key)],
    )  # fmt: skip
    assert denied.exit_code == 1, denied.output
    assert "StoreAccessDenied" in denied.output and "authentication failed" in denied.output
    assert time.monotonic() - started < 30, "not retried until --store-timeout"


REVOCABLE = "revocable"
"""A user of its own for the revocation test (the others keep USER's permission)."""


async def _as_root(server: EtcdServer, ca: Authority, directory: Path, calls: list[Any]) -> None:
    """Run ``calls`` (``(method name, request)`` of etcd's Auth service) as root."""
    cert, key = issue(ca, directory, "root-client")
    tls = grpc.ssl_channel_credentials(ca.path.read_bytes(), key.read_bytes(), cert.read_bytes())
    async with grpc.aio.secure_channel(server.endpoint, tls) as channel:
        auth = rpc.AuthStub(channel)
        login = rpc.AuthenticateRequest(name="root", password="root-password")
        token = (await auth.Authenticate(login)).token
        for method, request in calls:
            await getattr(auth, method)(request, metadata=(("token", token),))


def _permission() -> Any:
    return rpc.Permission(
        permType=rpc.Permission.READWRITE,
        key=PREFIX.encode(),
        range_end=prefix_end(PREFIX.encode()),
    )


async def test_access_revoked_after_start_up_is_a_named_503_and_not_ready(
    secure_etcd: SecureEtcd, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker's etcd role loses its permission while it runs: calls that need the
    store answer 503 StoreAccessDenied saying so (not 500 MetadataError), the cause is
    logged once, /readyz says not ready; the permission granted back, all is well again."""
    password = tmp_path / "password"
    password.write_text("revocable-password\n")
    await _as_root(secure_etcd.server, secure_etcd.ca, tmp_path, [
        ("UserAdd", rpc.AuthUserAddRequest(name=REVOCABLE, password="revocable-password")),
        ("RoleAdd", rpc.AuthRoleAddRequest(name=REVOCABLE)),
        ("UserGrantRole", rpc.AuthUserGrantRoleRequest(user=REVOCABLE, role=REVOCABLE)),
    ])  # fmt: skip
    await _grant(secure_etcd, tmp_path)
    credentials = secure_etcd.credentials(user=REVOCABLE, password_file=password)

    def make(port: int, txn_port: int) -> tuple[BrokerServer, CoordinatorServer]:
        store_url = secure_etcd.url("revoked")
        broker = BrokerSettings(
            broker_id="b1",
            advertise_url=f"http://127.0.0.1:{port}",
            store_url=store_url,
            store_credentials=credentials,
            ledger_url=f"file://{tmp_path / 'ledgers'}",
        )
        coordinator = CoordinatorSettings(
            advertise_url=f"http://127.0.0.1:{txn_port}",
            store_url=store_url,
            store_credentials=credentials,
            v4_coordinator_ids=0,
        )
        return BrokerServer(broker), CoordinatorServer(coordinator)

    broker, coordinator = await start_on_free_ports(make)
    url, txn_url = broker.settings.advertise_url, coordinator.settings.advertise_url
    try:
        async with Client(url) as client, aiohttp.ClientSession() as http:

            async def ready(server: str) -> bool:
                async with http.get(f"{server}/readyz") as response:
                    return response.status == 200

            await client.admin.create_topic("persistent://acme/orders/before")
            await wait_until(lambda: ready(txn_url), timeout=20, what="the coordinator ready")
            assert await ready(url)
            revoke = rpc.AuthRoleRevokePermissionRequest(
                role=REVOCABLE, key=PREFIX.encode(), range_end=prefix_end(PREFIX.encode())
            )
            caplog.clear()
            await _as_root(secure_etcd.server, secure_etcd.ca, tmp_path, [
                ("RoleRevokePermission", revoke)])  # fmt: skip
            for n in range(3):
                with pytest.raises(StoreAccessDeniedError) as caught:
                    await client.admin.create_topic(f"persistent://acme/orders/after-{n}")
                assert "refuses this server's credentials" in str(caught.value)
                assert "permission denied" in str(caught.value)
            async with http.put(f"{url}/admin/v2/persistent/acme/orders/raw") as raw:
                assert raw.status == 503
                assert (await raw.json())["error"] == "StoreAccessDenied"
            async with http.get(f"{url}/readyz") as unready:
                assert unready.status == 503
                assert "refuses the broker's credentials" in (await unready.json())["reason"]
            for _ in range(2):  # the coordinator: a new transaction's header is refused
                async with http.post(f"{txn_url}/txn/v2/new", json={}) as raw:
                    assert raw.status == 503
                    assert (await raw.json())["error"] == "StoreAccessDenied"
            async with http.get(f"{txn_url}/readyz") as unready:
                assert unready.status == 503
                assert "the coordinator's credentials" in (await unready.json())["reason"]
            denials = [r for r in caplog.records if "access denied" in r.getMessage()]
            # once per cause and store client (the broker's, the coordinator's)
            assert len(denials) == 2, [r.getMessage() for r in denials]
            await _grant(secure_etcd, tmp_path)
            await wait_until(lambda: ready(url), timeout=10, what="the broker ready again")
            await wait_until(lambda: ready(txn_url), timeout=10, what="the coordinator too")
            await client.admin.create_topic("persistent://acme/orders/granted")
    finally:
        await _grant(secure_etcd, tmp_path)  # (again, after a failure: the servers stop)
        await coordinator.stop()
        await broker.stop()


async def _grant(secure_etcd: SecureEtcd, tmp_path: Path) -> None:
    grant = rpc.AuthRoleGrantPermissionRequest(name=REVOCABLE, perm=_permission())
    await _as_root(secure_etcd.server, secure_etcd.ca, tmp_path, [("RoleGrantPermission", grant)])
