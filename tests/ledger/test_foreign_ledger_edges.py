"""A managed ledger one of whose OLDER closed ledgers has a foreign file (another
cluster's copy, a wrong restore; its nonce not the one recorded). Each failed before its
fix.

Real components: files in ``tmp_path``, a real etcd (two key namespaces stand for two
independent clusters).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from segtxn.ledger import FileLogStorage, LedgerSettings, ManagedLedger, RetentionPolicy
from segtxn.ledger.errors import LedgerMismatch
from segtxn.metastore import open_store
from segtxn.metastore.etcd_server import EtcdServer
from tests.ledger.foreign import cluster_url, restore_wrong, two_volumes

NAME = "persistent://t/n/foreign"


# ---------------------------------------------------------------------------------------
# 1. Opening checked the nonce of the last ledger only: one with a foreign older ledger
#    opened, and only a read of that ledger found out (a topic that loaded, and stalled).


async def test_opening_refuses_a_foreign_older_ledger_and_names_it(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    async with open_store(cluster_url(etcd_server, tmp_path, "a")) as store:
        ours, theirs = await two_volumes(etcd_server, tmp_path, store, NAME)
        path = restore_wrong(ours, theirs, NAME, 2)
        storage = FileLogStorage(ours)
        held = sorted(p.read_bytes() for p in ours.rglob("*.log"))

        with pytest.raises(LedgerMismatch) as caught:
            await ManagedLedger.open(NAME, store, storage, LedgerSettings())
        assert caught.value.path == str(path)
        assert "ledger 2" in str(caught.value) and "nonce" in str(caught.value)
        # refused before anything was recovered or created: the volume is as it was
        assert sorted(p.read_bytes() for p in ours.rglob("*.log")) == held


# ---------------------------------------------------------------------------------------
# 2. Retention met a foreign file (replaced under an open ledger here) and said so at
#    ERROR on every round, for as long as it lasted (until an operator acts): once per
#    file is enough, the later rounds at DEBUG.


async def test_retention_says_a_foreign_file_at_error_once(
    etcd_server: EtcdServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with open_store(cluster_url(etcd_server, tmp_path, "a")) as store:
        ours, theirs = await two_volumes(etcd_server, tmp_path, store, NAME)
        storage = FileLogStorage(ours)
        ledger = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
        try:
            path = restore_wrong(ours, theirs, NAME, 2)  # while it is open
            await ledger.open_cursor("all", start="latest")  # everything is consumed
            with caplog.at_level(logging.DEBUG):
                for _ in range(3):
                    await ledger.trim(RetentionPolicy(retention_time_s=0))
            assert ledger.ledger_ids[0] == 2  # kept, with the ones after it
            said = [r for r in caplog.records if str(path) in r.getMessage()]
            assert [r.levelno for r in said if r.levelno >= logging.ERROR] == [logging.ERROR], [
                (r.levelname, r.getMessage()) for r in said
            ]
            assert sum(r.levelno == logging.DEBUG for r in said) == 2, [
                r.getMessage() for r in said
            ]
        finally:
            await ledger.close()
