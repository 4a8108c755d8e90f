"""A deleted ledger leaves no empty directory behind, on the broker's disk or on its
replicas' nodes (issue 22: one per retired segment piled up), and removing one never gets
in the way of a ledger of the same name being created (segtxn/ledger/files.py).

Real files; replicated ledgers on real storage nodes behind real aiohttp servers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from segtxn.ledger import FileLogStorage, LedgerMissing, LedgerSettings, ManagedLedger
from segtxn.ledger.files import remove_if_empty
from segtxn.ledger.records import FORMAT
from segtxn.ledger.replicas import ReplicaNode
from segtxn.metastore import MetadataStore
from tests.ledger.replicas import Cluster, payloads_of, started

NAME = "segment://t/n/orders/0"
SMALL = LedgerSettings(max_ledger_bytes=300)


def test_deleting_the_last_log_of_a_name_removes_its_directory(tmp_path: Path) -> None:
    storage = FileLogStorage(tmp_path)
    for ledger_id in (1, 2):
        storage.create(NAME, ledger_id).close()
    directory = storage.path(NAME, 1).parent
    storage.delete(NAME, 1)
    assert directory.is_dir()  # ledger 2 is still in it
    storage.delete(NAME, 2)
    assert not directory.exists()
    storage.delete(NAME, 2)  # idempotent
    assert list(tmp_path.iterdir()) == []
    storage.create(NAME, 3).close()  # the name is used again: its directory made again
    assert storage.exists(NAME, 3)


def test_a_directory_holding_anything_else_is_kept(tmp_path: Path) -> None:
    storage = FileLogStorage(tmp_path)
    storage.create(NAME, 1).close()
    stray = storage.path(NAME, 1).parent / "operator-notes.txt"
    stray.write_text("not a log")
    storage.delete(NAME, 1)
    assert stray.read_text() == "not a log"
    assert not remove_if_empty(stray.parent)


def test_a_create_whose_directory_a_delete_removes_under_it_makes_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race forced: another name's last log is deleted (its directory removed) right
    between a create's ``mkdir`` and its ``open``."""
    storage = FileLogStorage(tmp_path)
    target = storage.path(NAME, 7)
    real_open = os.open
    removed: list[bool] = []

    def racing_open(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        if Path(path) == target and not removed:
            removed.append(remove_if_empty(target.parent))  # the delete lands here
        return real_open(path, flags, mode, **kw)

    monkeypatch.setattr(os, "open", racing_open)
    log = storage.create(NAME, 7)
    log.append_batch([b"kept"])
    log.close()
    assert removed == [True]
    assert storage.open(NAME, 7, log_format=FORMAT, entries=1).read(0, 0) == [b"kept"]


def test_a_node_removes_the_directory_of_a_fence_without_a_replica(tmp_path: Path) -> None:
    node = ReplicaNode(tmp_path, tail_bytes=1 << 20)
    try:
        with pytest.raises(LedgerMissing, match="not on this node"):
            node.fence(NAME, 4)
        assert node._fence_path((NAME, 4)).exists()
        node.delete(NAME, 4)
        assert [p.name for p in tmp_path.iterdir()] == [".instance"]
    finally:
        node.close()


async def test_deleting_a_replicated_ledger_leaves_no_directory_on_any_node(
    store: MetadataStore, cluster: Cluster
) -> None:
    await started(cluster, 3)
    storage = cluster.storage(0, write=3, ack=2)
    ledger = await ManagedLedger.open(NAME, store, storage, SMALL)
    for i in range(12):
        await ledger.append(f"entry-{i:03d}".encode() * 4)
    assert len(ledger.ledger_ids) >= 2
    directories = [s.node._files._dir(NAME) for s in cluster.servers]
    assert all(d.is_dir() for d in directories)
    await ledger.delete()
    assert [d for d in directories if d.exists()] == []

    again = await ManagedLedger.open(NAME, store, storage, SMALL)  # the same name, new
    await again.append(b"new")
    assert await payloads_of(again) == [b"new"]
    await again.close()
