"""The store's credentials files read again when they change, against a real etcd with
TLS, client certificates and users: a password changed in etcd and then in its file is
picked up without a restart; a renewed client certificate is used for new connections; a
broken set (a key of another certificate, a file that is not PEM) is refused with a
warning and the old set keeps working."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from aetcd import rpc

from segtxn.metastore import StoreAccessDenied, StoreSettings, open_store
from segtxn.metastore.etcd import EtcdEngine
from segtxn.metastore.etcd_credentials import LiveCredentials
from tests.auth.certs import issue
from tests.auth.test_store_security import (
    SecureEtcd,
    _as_root,
    _permission,
    running_secure_etcd,
)
from tests.waiting import wait_until

USER = "rotating"


@pytest.fixture(scope="module")
def secure_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureEtcd]:
    with running_secure_etcd(tmp_path_factory.mktemp("secure-etcd")) as etcd:
        yield etcd


def _live(engine: object) -> LiveCredentials:
    assert isinstance(engine, EtcdEngine)
    return engine.connection._credentials


async def test_a_new_password_and_a_renewed_certificate_without_a_restart(
    secure_etcd: SecureEtcd, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    password = tmp_path / "password"
    password.write_text("first-password\n")
    await _as_root(secure_etcd.server, secure_etcd.ca, tmp_path, [
        ("UserAdd", rpc.AuthUserAddRequest(name=USER, password="first-password")),
        ("RoleAdd", rpc.AuthRoleAddRequest(name=USER)),
        ("UserGrantRole", rpc.AuthUserGrantRoleRequest(user=USER, role=USER)),
        ("RoleGrantPermission", rpc.AuthRoleGrantPermissionRequest(name=USER, perm=_permission())),
    ])  # fmt: skip
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    first_cert, first_key = issue(secure_etcd.ca, tmp_path, "first")
    cert.write_bytes(first_cert.read_bytes())
    key.write_bytes(first_key.read_bytes())
    credentials = secure_etcd.credentials(
        cert_file=cert, key_file=key, user=USER, password_file=password, reload_check_s=0
    )
    store = open_store(secure_etcd.url("rotating"), StoreSettings(credentials=credentials))
    try:
        await store.put("/k", b"1")
        live = _live(store.engine)

        # The password changed in etcd: the store's token goes, the old password fails.
        await _as_root(secure_etcd.server, secure_etcd.ca, tmp_path, [
            ("UserChangePassword",
             rpc.AuthUserChangePasswordRequest(name=USER, password="second-password")),
        ])  # fmt: skip
        with pytest.raises(StoreAccessDenied, match="authentication failed"):
            await store.put("/k", b"2")
        # ... and then in the file (as the kubelet updates a Secret): taken up by itself.
        password.write_text("second-password\n")

        async def writes() -> bool:
            try:
                await store.put("/k", b"3")
            except StoreAccessDenied:
                return False
            return True

        await wait_until(writes, timeout=10, what="a write with the new password")
        assert (live.reloads, live.tls_reloads) == (1, 0) and store.engine.denied is None

        # A broken set: a key of another certificate. Refused, said once; the old set works.
        other_cert, other_key = issue(secure_etcd.ca, tmp_path, "other")
        key.write_bytes(other_key.read_bytes())
        caplog.set_level(logging.WARNING, "segtxn.metastore.etcd_credentials")
        for n in range(3):
            assert live.check() is False  # looked at, refused
            await store.put("/k", f"broken-{n}".encode())
        refusals = [r for r in caplog.records if "keeping the current credentials" in r.message]
        assert len(refusals) == 1, [r.message for r in refusals]
        assert "not a certificate and its key" in refusals[0].message
        assert live.reloads == 1

        # The certificate renewed (its pair complete): new connections present it.
        cert.write_bytes(other_cert.read_bytes())
        assert live.check() is True and live.reloads == 2
        await store.put("/k", b"renewed")
        record = await store.get("/k")
        assert record is not None and record.value == b"renewed"
        engine = store.engine
        assert isinstance(engine, EtcdEngine) and len(engine.connection._retired) == 1
    finally:
        await store.close()


def test_a_ca_that_is_not_pem_is_refused_and_the_old_one_kept(
    secure_etcd: SecureEtcd, tmp_path: Path
) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_bytes(secure_etcd.ca.path.read_bytes())
    live = LiveCredentials(secure_etcd.credentials(ca_file=ca, user=None, password_file=None,
                                                   reload_check_s=0))  # fmt: skip
    first = live.tls
    ca.write_text("not a certificate")
    assert live.check() is False and live.tls is first
    ca.write_bytes(secure_etcd.ca.path.read_bytes() + b"\n")  # a new, good file
    assert live.check() is True and live.tls is not first
