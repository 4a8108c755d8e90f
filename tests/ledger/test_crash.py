"""Crash tests with real processes: a writer is SIGKILLed at random moments (seeded; the
seed is printed) and the ledger is reopened from its files and the etcd metadata."""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from segtxn.ledger import (
    FileLogStorage,
    LedgerCorrupted,
    LedgerSealed,
    LedgerSettings,
    ManagedLedger,
    Position,
)
from segtxn.ledger.metadata import decode, metadata_key
from segtxn.ledger.records import HEADER_SIZE, decode_header, scan
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


# ================================================================= a crash, then damage


async def _killed(
    url: str, store: MetadataStore, data_dir: Path, name: str, rng: random.Random
) -> tuple[list[str], Path, list[Position]]:
    """Kill a writer until its open ledger holds acknowledged entries; returns its lines,
    that ledger's file and the acknowledged positions in it."""
    for _ in range(5):
        lines = run_and_kill(
            url, data_dir, name, mode="append", seed=rng.randrange(2**31),
            kill_after_acks=rng.randint(20, 200),
        )  # fmt: skip
        record = await store.get(metadata_key(name))
        assert record is not None
        last = decode(record.value).ledgers[-1]
        assert last.entries is None  # a crash leaves it open
        acked = [Position.parse(ln.split()[1]) for ln in lines if ln.startswith("ACK ")]
        mine = sorted(p for p in acked if p.ledger_id == last.id)
        if mine:
            return lines, FileLogStorage(data_dir).path(name, last.id), mine
    raise AssertionError("five kills and never an acknowledged entry in the open ledger")


@pytest.mark.slow
async def test_sigkill_then_damage_to_an_acknowledged_entry_is_refused(
    etcd_url: str, tmp_path: Path
) -> None:
    """The tester's case: 8 damaged bytes mid-ledger lost the acknowledged entries after
    them, silently. Every acknowledged entry is covered by a mark a SIGKILL cannot remove."""
    seed = random.randrange(2**32)
    print(f"damage after crash seed {seed}")
    rng = random.Random(seed)
    store = open_store(etcd_url)
    try:
        for round_ in range(2):
            name = f"damaged-{round_}"
            _, path, acked = await _killed(etcd_url, store, tmp_path, name, rng)
            data = path.read_bytes()
            offsets = scan(data, start=HEADER_SIZE, nonce=decode_header(data, _ledger_id(path)))
            target = offsets.offsets[acked[len(acked) // 2].entry_id]
            with path.open("r+b") as f:  # 8 bytes of its payload
                f.seek(target + 18)
                f.write(bytes(b ^ 0xFF for b in data[target + 18 : target + 26]))
            before = path.read_bytes()
            with pytest.raises(LedgerCorrupted, match="acknowledged") as caught:
                await ManagedLedger.open(name, store, FileLogStorage(tmp_path), SETTINGS)
            assert caught.value.path == str(path)
            assert path.read_bytes() == before  # nothing cut
    finally:
        await store.close()


@pytest.mark.slow
async def test_sigkill_then_a_cut_tail_loses_no_acknowledged_entry(
    etcd_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The tester's case: the last 5 bytes cut off lost the last acknowledged entry."""
    seed = random.randrange(2**32)
    print(f"cut after crash seed {seed}")
    rng = random.Random(seed)
    store = open_store(etcd_url)
    try:
        for round_ in range(3):
            name = f"cut-{round_}"
            lines, path, _ = await _killed(etcd_url, store, tmp_path, name, rng)
            os.truncate(path, path.stat().st_size - 5)
            caplog.clear()
            ledger = await verify(store, tmp_path, name, lines)  # every ack is there
            await ledger.close()
            warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
            assert any(f"truncated {path}" in line for line in warnings), warnings
    finally:
        await store.close()


def _ledger_id(path: Path) -> int:
    return int(path.stem)
