"""Set-ups shared by the tests of foreign ledger files: a file under a ledger's name that is
not the one its metadata recorded (another cluster's volume, a restore from the wrong
backup: its nonce is not the recorded one).

Two key namespaces of one real etcd stand for two independent clusters, ``a`` (ours) and
``b`` (theirs), each writing the same managed ledger on its own volume in ``tmp_path``.
Used by tests/ledger/test_ledger_identity_edges.py, test_foreign_ledger_edges.py,
test_ledger_files_edges.py and tests/broker/test_foreign_volume_edges.py.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import aiohttp

from segtxn.broker.app import BrokerServer
from segtxn.broker.settings import BrokerSettings
from segtxn.ledger import FileLogStorage, LedgerSettings, ManagedLedger
from segtxn.metastore import MetadataStore, open_store
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.web import Listener


def cluster_url(etcd_server: EtcdServer, tmp_path: Path, cluster: str) -> str:
    """The store URL of cluster ``cluster`` in this test: a key namespace of its own."""
    return etcd_server.url(f"/cluster-{os.getpid()}-{tmp_path.name}-{cluster}")


async def write_ledgers(store: MetadataStore, root: Path, name: str, payloads: list[bytes]) -> None:
    """``name`` with ``payloads``, one ledger each (rolled over after each), cleanly closed."""
    ledger = await ManagedLedger.open(name, store, FileLogStorage(root), LedgerSettings())
    try:
        for payload in payloads:
            await ledger.append(payload)
            await ledger.roll_over()
    finally:
        await ledger.close()


async def two_volumes(
    etcd_server: EtcdServer, tmp_path: Path, store: MetadataStore, name: str
) -> tuple[Path, Path]:
    """``name`` in ``store`` on ``tmp_path / "ours"`` and cluster b's ``name`` on
    ``tmp_path / "theirs"``: on both, ledgers 1 and 2 hold an entry each and 3 is empty,
    under the same file names. Returns the two volumes (ours, theirs)."""
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    async with open_store(cluster_url(etcd_server, tmp_path, "b")) as other:
        await write_ledgers(store, ours, name, [b"ours-0", b"ours-1"])
        await write_ledgers(other, theirs, name, [b"them-0", b"them-1"])
    return ours, theirs


def restore_wrong(ours: Path, theirs: Path, name: str, ledger_id: int) -> Path:
    """Put cluster b's file of ledger ``ledger_id`` of ``name`` in place of ours (a restore
    from the wrong backup); returns its path on our volume."""
    path = FileLogStorage(ours).path(name, ledger_id)
    shutil.copyfile(FileLogStorage(theirs).path(name, ledger_id), path)
    return path


def broker_on(store_url: str, data_dir: Path) -> BrokerServer:
    """A broker (not started) of the cluster at ``store_url`` with its files in ``data_dir``."""
    listener = Listener("127.0.0.1")  # its port, held from the pick on
    return BrokerServer(
        BrokerSettings(
            broker_id="b1",
            advertise_url=f"http://127.0.0.1:{listener.port}",
            store_url=store_url,
            ledger_url=f"file://{data_dir}",
        ),
        listener=listener,
    )


async def readyz(broker: BrokerServer) -> tuple[int, dict[str, Any]]:
    """``broker``'s ``/readyz`` answer over HTTP: its status and its JSON body."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(broker.settings.advertise_url + "/readyz") as response,
    ):
        return response.status, await response.json()
