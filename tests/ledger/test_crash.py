"""Crash tests with real processes: a writer is SIGKILLed at random moments (seeded; the
seed is printed) and the ledger is reopened from its files and the etcd metadata."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from segtxn.ledger import FileLogStorage, LedgerSealed, LedgerSettings, ManagedLedger, Position
from segtxn.metastore import MetadataStore, open_store
from segtxn.metastore.etcd_server import EtcdServer
from tests.ledger.crash_writer import digest

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = LedgerSettings(max_ledger_bytes=64 * 1024, max_batch_bytes=32 * 1024)


@pytest.fixture
async def etcd_url(etcd_server: EtcdServer, tmp_path: Path) -> AsyncIterator[str]:
    yield etcd_server.url(f"/crash-{os.getpid()}-{tmp_path.name}")


def run_and_kill(
    url: str,
    data_dir: Path,
    name: str,
    *,
    mode: str,
    seed: int,
    kill_after_acks: int,
    kill_at: str = "SEALED",
) -> list[str]:
    """Start a writer, SIGKILL it after ``kill_after_acks`` acknowledgments or once it
    prints a line starting with ``kill_at``, and return every line it printed."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.ledger.crash_writer",
            url,
            str(data_dir),
            name,
            mode,
            str(seed),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 60
    acks = 0
    try:
        for line in proc.stdout:
            lines.append(line.strip())
            acks += line.startswith("ACK ")
            if acks >= kill_after_acks or line.startswith(kill_at):
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"writer made no progress: {lines[-5:]}")
    finally:
        proc.send_signal(signal.SIGKILL)
        rest, _ = proc.communicate(timeout=30)
    # lines the writer flushed before it died were acknowledged too
    lines += [ln.strip() for ln in rest.splitlines()]
    return lines


async def verify(
    store: MetadataStore, data_dir: Path, name: str, lines: list[str]
) -> ManagedLedger:
    acked = {
        Position.parse(p): h for tag, p, h in (ln.split() for ln in lines if ln.startswith("ACK "))
    }
    ledger = await ManagedLedger.open(name, store, FileLogStorage(data_dir), SETTINGS)
    entries = await ledger.read(Position(0, 0), max_entries=1_000_000, max_bytes=1 << 40)
    stored = {e.position: digest(e.payload) for e in entries}
    missing = {p for p in acked if p not in stored}
    assert not missing, f"acknowledged appends lost: {sorted(missing)[:5]}"
    wrong = {p for p, h in acked.items() if stored[p] != h}
    assert not wrong, f"acknowledged appends changed: {sorted(wrong)[:5]}"
    assert [e.position for e in entries] == sorted(stored)  # nothing served out of order
    return ledger


@pytest.mark.slow
async def test_sigkill_during_group_commit_loses_no_acknowledged_append(
    etcd_url: str, tmp_path: Path
) -> None:
    seed = random.randrange(2**32)
    print(f"crash test seed {seed}")
    rng = random.Random(seed)
    store = open_store(etcd_url)
    try:
        total_acked = 0
        for round_ in range(4):
            lines = run_and_kill(
                etcd_url,
                tmp_path,
                "crashy",
                mode="append",
                seed=rng.randrange(2**31),
                kill_after_acks=rng.randint(5, 400),
            )
            total_acked += sum(ln.startswith("ACK ") for ln in lines)
            ledger = await verify(store, tmp_path, "crashy", lines)
            before = ledger.last_confirmed
            position = await ledger.append(f"after-crash-{round_}".encode())
            assert before is None or position > before  # it accepts appends again
            await ledger.close()
        assert total_acked > 0
    finally:
        await store.close()


@pytest.mark.slow
async def test_sigkill_around_seal_leaves_it_sealed_or_not(etcd_url: str, tmp_path: Path) -> None:
    seed = random.randrange(2**32)
    print(f"seal crash test seed {seed}")
    rng = random.Random(seed)
    store = open_store(etcd_url)
    outcomes = set()
    try:
        # mid-seal, just after the seal, then at random moments
        for round_, kill_at in enumerate(["SEALING", "SEALED", "SEALED", "SEALED"]):
            name = f"seal-{round_}"
            lines = run_and_kill(
                etcd_url,
                tmp_path,
                name,
                mode="seal",
                seed=rng.randrange(2**31),
                kill_after_acks=10**9 if round_ < 2 else rng.randint(20, 2000),
                kill_at=kill_at,
            )
            ledger = await verify(store, tmp_path, name, lines)
            said_sealed = any(ln.startswith("SEALED") for ln in lines)
            if said_sealed:
                assert ledger.is_sealed  # an acknowledged seal is durable
            if ledger.is_sealed:
                with pytest.raises(LedgerSealed):
                    await ledger.append(b"late")
                acked = [Position.parse(ln.split()[1]) for ln in lines if ln.startswith("ACK ")]
                assert all(
                    ledger.last_confirmed is not None and p <= ledger.last_confirmed for p in acked
                )
            else:
                await ledger.append(b"still open")
            outcomes.add(ledger.is_sealed)
            await ledger.close()
    finally:
        await store.close()
    assert True in outcomes  # the writer reaches the seal in at least one round
