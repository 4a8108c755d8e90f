"""A trim whose ledger file cannot be removed (permission denied, an I/O error) goes on with
the others. The trim's metadata change has landed when its files are deleted: before, the
first file that failed raised out of the trim (DeleteFailed), the ledgers after it were
neither deleted nor reported (their files left for good; higher layers never told to trim
their indexes), and the trim's caller took it for failed.

Replicated ledgers (real storage nodes behind real aiohttp servers, tests/ledger/replicas.py):
a copy on another node that cannot be removed never failed the trim, but its writer was told
"HTTP 500" (the node logged a traceback) rather than why; and the node's sweep, which
removes such leftovers once they can be, raised at the first it could not remove, so every
round stopped there and the replicas after it stayed for good."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from segtxn.ledger import FileLogStorage, LedgerSettings, ManagedLedger, RetentionPolicy
from segtxn.ledger.metadata import decode, metadata_key
from segtxn.ledger.replicas import sweep
from segtxn.metastore import MetadataStore, open_store
from tests.ledger.replicas import Cluster, started
from tests.ledger.test_replicated_sweep import age

NAME = "persistent://t/n/undeletable"


async def test_a_trimmed_ledger_whose_file_cannot_be_removed_leaves_only_that_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    storage = FileLogStorage(tmp_path / "ledgers")
    async with open_store("memory://") as store:
        ledger = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
        try:
            for i in range(3):
                await ledger.append(b"m%d" % i)
                await ledger.roll_over()
            await ledger.open_cursor("all", start="latest")  # everything is consumed
            first, second = storage.path(NAME, 1), storage.path(NAME, 2)
            assert first.exists() and second.exists()
            unlink = Path.unlink

            def refusing(path: Path, missing_ok: bool = False) -> None:
                if path == first:
                    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
                unlink(path, missing_ok=missing_ok)

            monkeypatch.setattr(Path, "unlink", refusing)
            with caplog.at_level(logging.WARNING):
                trimmed = await ledger.trim(RetentionPolicy(retention_time_s=0))
            assert trimmed.ledgers[:2] == [1, 2], trimmed
            assert first.exists() and not second.exists()
            said = [r.getMessage() for r in caplog.records if "its file is left" in r.getMessage()]
            assert len(said) == 1 and str(first) in said[0], said
        finally:
            monkeypatch.undo()
            await ledger.close()


# ---------------------------------------------------------------------------------------
# Replicated ledgers: a copy on another storage node that cannot be removed


REPLICATED = "persistent://t/n/undeletable-replicated"
AT_ONCE = RetentionPolicy(retention_time_s=0)
HOUR_S = 3600.0


def refuse_to_unlink(monkeypatch: pytest.MonkeyPatch, *refused: Path) -> None:
    """``Path.unlink`` of any of ``refused`` fails with EACCES (a volume's permissions)."""
    unlink = Path.unlink

    def refusing(path: Path, missing_ok: bool = False) -> None:
        if path in refused:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", refusing)


async def consumed_ledgers(store: MetadataStore, cluster: Cluster, count: int) -> ManagedLedger:
    """``REPLICATED`` on b0, b1, b2 (three copies, two to acknowledge), with ``count``
    closed ledgers of one entry each, every entry consumed."""
    ledger = await ManagedLedger.open(
        REPLICATED, store, cluster.storage(0, write=3, ack=2), LedgerSettings()
    )
    for i in range(count):
        await ledger.append(b"m%d" % i)
        await ledger.roll_over()
    await ledger.open_cursor("all", start="latest")
    return ledger


async def test_a_replicated_trim_whose_copy_on_another_node_cannot_be_removed_goes_on(
    store: MetadataStore,
    cluster: Cluster,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """b1 cannot remove its copy of ledger 1 (its node's volume refuses). The trim has
    landed (the record no longer names the ledger): it deletes every other copy, reports
    every trimmed ledger, says once which copy is left and why, and later trims go on.
    Once b1 can delete again, its sweep removes the copy (no placement names it)."""
    await started(cluster, 3)
    ledger = await consumed_ledgers(store, cluster, 3)
    b1 = cluster.servers[1]
    stuck = b1.node._files.path(REPLICATED, 1)
    try:
        assert [cluster.holds(i, REPLICATED, 1) for i in range(3)] == [1, 1, 1]
        refuse_to_unlink(monkeypatch, stuck)
        with caplog.at_level(logging.WARNING):
            trimmed = await ledger.trim(AT_ONCE)

        assert trimmed.ledgers == [1, 2, 3], trimmed
        record = await store.get(metadata_key(REPLICATED))
        assert record is not None and [i.id for i in decode(record.value).ledgers] == [4]
        assert stuck.exists()
        assert [cluster.holds(i, REPLICATED, 1) for i in (0, 2)] == [0, 0]
        for ledger_id in (2, 3):
            assert [cluster.holds(i, REPLICATED, ledger_id) for i in range(3)] == [0, 0, 0]
        said = [r.getMessage() for r in caplog.records if "was not deleted" in r.getMessage()]
        assert len(said) == 1, said
        assert "ledger 1 " in said[0] and str(b1.member) in said[0], said
        assert "Permission denied" in said[0], said  # why, not an HTTP status
        assert not [r for r in caplog.records if r.name == "aiohttp.server"]  # (a traceback)

        later = await ledger.append(b"later")
        await ledger.roll_over()
        await ledger.cursors["all"].ack([later])
        assert (await ledger.trim(AT_ONCE)).ledgers == [4]

        monkeypatch.undo()
        age(b1.node, REPLICATED, 1, 2 * HOUR_S)
        assert await sweep(b1.node, store, b1.member, grace_s=HOUR_S) == [(REPLICATED, 1)]
        assert not stuck.exists()
    finally:
        monkeypatch.undo()
        await ledger.close()


async def test_a_sweep_that_meets_a_replica_it_cannot_remove_removes_the_others(
    store: MetadataStore,
    cluster: Cluster,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """b2 was away while ledgers 1..3 were trimmed: it keeps their copies, which its sweep
    removes; the first of them cannot be removed (its volume refuses). The sweep removes
    the others, and says once which copy is left and why (every round meets it)."""
    await started(cluster, 3)
    ledger = await consumed_ledgers(store, cluster, 3)
    b2 = cluster.servers[2]
    stuck = b2.node._files.path(REPLICATED, 1)
    try:
        await cluster.stop(2)
        assert (await ledger.trim(AT_ONCE)).ledgers == [1, 2, 3]
        await cluster.start(2)
        for ledger_id in (1, 2, 3):
            age(b2.node, REPLICATED, ledger_id, 2 * HOUR_S)
        refuse_to_unlink(monkeypatch, stuck)
        with caplog.at_level(logging.WARNING):
            assert await sweep(b2.node, store, b2.member, grace_s=HOUR_S) == [
                (REPLICATED, 2),
                (REPLICATED, 3),
            ]
            assert await sweep(b2.node, store, b2.member, grace_s=HOUR_S) == []
        assert stuck.exists()
        said = [r.getMessage() for r in caplog.records if str(stuck) in r.getMessage()]
        assert len(said) == 1 and "Permission denied" in said[0], said

        monkeypatch.undo()
        assert await sweep(b2.node, store, b2.member, grace_s=HOUR_S) == [(REPLICATED, 1)]
    finally:
        monkeypatch.undo()
        await ledger.close()
