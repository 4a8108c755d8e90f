"""The CA files read again when they change, with real servers and files: a new client CA
(``--tls-client-ca``) takes client certificates of the new CA and no longer those of the
one taken out; a new cluster CA (``--tls-ca``) with certificates it issued keeps the
servers' own calls to each other working without a restart; a CA file that does not load
is refused, said once, and the old set kept."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from segtxn.auth import ServerCertificate
from segtxn.client import Client, ServerError, Unauthenticated
from tests.auth.certs import authority, issue
from tests.auth.test_tls import TlsCluster, _start, _stop
from tests.waiting import wait_until

BOTH_LOOPS = True
"""Each test runs on asyncio's loop and on uvloop (tests/auth/conftest.py)."""


def replace(source: Path | bytes, target: Path) -> None:
    """Write ``target`` as a Secret update does: a new file swapped in."""
    staged = target.with_suffix(".staged")
    if isinstance(source, bytes):
        staged.write_bytes(source)
    else:
        shutil.copyfile(source, staged)
    os.replace(staged, target)


async def _lists(cluster: TlsCluster, cert: Path, key: Path) -> bool:
    """Whether a client presenting ``cert`` gets an answer (not a refused handshake)."""
    async with Client(
        cluster.url, tls_ca=cluster.ca.path, tls_cert=cert, tls_key=key, operation_timeout_s=2
    ) as client:
        try:
            await client.admin.list_topics("persistent", "acme", "tls")
        except Unauthenticated:
            raise  # a certificate the server did not see: not what is tested
        except ServerError:  # the handshake refused: the connection dropped
            return False
    return True


async def test_a_new_client_ca_is_in_force_and_the_old_one_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ca = authority(tmp_path, "cluster-ca")
    cert, key = issue(ca, tmp_path, "server")
    old_clients, new_clients = authority(tmp_path, "old-clients"), authority(tmp_path, "new")
    client_ca = tmp_path / "client-ca.pem"
    replace(old_clients.path, client_ca)
    old_cert, old_key = issue(old_clients, tmp_path, "old-client")
    new_cert, new_key = issue(new_clients, tmp_path, "new-client")
    cluster = await _start(tmp_path, ca, cert, key, client_ca=client_ca)
    certificate = cluster.broker.certificate
    assert certificate is not None
    try:
        assert await _lists(cluster, old_cert, old_key)
        assert not await _lists(cluster, new_cert, new_key)
        # A CA file that does not load: refused once, the old CA stays.
        caplog.set_level(logging.WARNING, "segtxn.auth.tls")
        replace(b"not a certificate", client_ca)
        for _ in range(3):
            assert certificate.check() is False
        refusals = [r for r in caplog.records if "keeping the current" in r.getMessage()]
        assert len(refusals) == 1 and "client-ca.pem" in refusals[0].getMessage()
        assert await _lists(cluster, old_cert, old_key)
        # The new CA: its clients in, the old one's out, no restart.
        replace(new_clients.path, client_ca)
        await wait_until(lambda: certificate.reloads >= 1, timeout=10, what="the reload")
        assert await _lists(cluster, new_cert, new_key)
        assert not await _lists(cluster, old_cert, old_key)
    finally:
        await _stop(cluster)


async def test_a_new_cluster_ca_keeps_the_servers_calls_to_each_other_working(
    tmp_path: Path,
) -> None:
    """A v4 commit goes coordinator -> broker and broker -> coordinator: each checks the
    other's certificate against ``--tls-ca`` and presents its own."""
    ca = authority(tmp_path, "cluster-ca")
    cert, key = issue(ca, tmp_path, "server")
    cluster = await _start(tmp_path, ca, cert, key)
    topic = "persistent://acme/tls/rotated"
    try:
        (tmp_path / "rotated").mkdir()
        rotated = authority(tmp_path / "rotated", "rotated-ca")
        new_cert, new_key = issue(rotated, tmp_path / "rotated", "server")
        for new, old in ((new_key, key), (new_cert, cert), (rotated.path, ca.path)):
            replace(new, old)
        for server in (cluster.broker, cluster.coordinator):
            certificate = server.certificate
            assert certificate is not None

            def reloaded(c: ServerCertificate = certificate) -> bool:
                return c.reloads >= 1

            await wait_until(reloaded, timeout=10, what="reload")
        async with Client(cluster.url, tls_ca=rotated.path) as client:
            await client.admin.create_topic(topic)
            producer = await client.create_producer(topic)
            txn = await client.transaction().start("v4")
            await producer.send(b"after the new CA", txn=txn)
            await txn.commit()
    finally:
        await _stop(cluster)
