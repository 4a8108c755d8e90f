"""A private etcd (segtxn.metastore.etcd_server) serves on the ports picked for it, or says
it cannot: its ports are picked free before etcd binds them, and on a test run with several
workers another etcd can take them first. A health check alone then passed on the other
etcd, and its owner went on with another test's store."""

from __future__ import annotations

from pathlib import Path

import pytest

from segtxn.metastore.etcd_server import EtcdServer, PortTaken


def member_peer_urls(server: EtcdServer) -> list[str]:
    import json
    import urllib.request

    request = urllib.request.Request(
        f"http://{server.endpoint}/v3/cluster/member/list", data=b"{}", method="POST"
    )
    with urllib.request.urlopen(request, timeout=5) as r:
        return [url for m in json.loads(r.read())["members"] for url in m["peerURLs"]]


def test_a_first_start_whose_port_another_etcd_took_starts_again_on_fresh_ports(
    tmp_path: Path,
) -> None:
    (tmp_path / "other").mkdir()
    (tmp_path / "mine").mkdir()
    other = EtcdServer(data_dir=tmp_path / "other", unsafe_no_fsync=True)
    other.start()
    taken = other.client_port
    server = EtcdServer(data_dir=tmp_path / "mine", client_port=taken, unsafe_no_fsync=True)
    try:
        server.start()
        assert server.client_port != taken
        assert member_peer_urls(server) == [f"http://127.0.0.1:{server.peer_port}"]
    finally:
        server.stop()
        other.stop()


def test_a_restart_whose_port_another_etcd_took_says_so(tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    (tmp_path / "mine").mkdir()
    server = EtcdServer(data_dir=tmp_path / "mine", unsafe_no_fsync=True)
    server.start()
    server.kill()
    other = EtcdServer(
        data_dir=tmp_path / "other", client_port=server.client_port, unsafe_no_fsync=True
    )
    other.start()
    try:
        with pytest.raises(PortTaken, match="another etcd answers on"):
            server.start()  # its clients hold its URL: it keeps its ports
        assert server.process is not None and server.process.poll() is not None  # not left
    finally:
        server.stop()
        other.stop()
