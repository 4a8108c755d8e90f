"""The replication benchmark (``bench/replication.py``) end to end, with very short
durations: two clusters of three broker processes on a private etcd, both loads and the
transactional loop on both, one take-over after a SIGKILL, and the exactly-once check of
what was acknowledged."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "replication.py"


@pytest.mark.slow
def test_the_benchmark_prints_the_ratios_and_a_take_over() -> None:
    args = ["--seconds", "0.5", "--rounds", "1", "--producers", "2", "--ctp-messages", "200"]
    args += ["--trials", "1", "--session-ttl", "1"]
    run = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=100,
    )
    out = run.stdout
    assert run.returncode == 0, out + run.stderr
    for mode in ("one at a time", "pipelined"):
        assert re.search(rf"^{mode}: replicated ÷ unreplicated: msgs/s [\d.]+x", out, re.M), out
    assert re.search(r"^txn consume-transform-produce .* replicated ÷ unreplicated", out, re.M)
    assert re.search(r"^take-over: p50 [\d.]+ s, p99 [\d.]+ s \(session TTL 1 s", out, re.M), out
    assert re.search(r"^1 +r3-b\d +\d+ +\d+ +[\d.]+ +[\d.]+ +[\d.]+ +r3-b\d$", out, re.M), out
    assert "exactly once: all " in out, out
    assert "are kept in" not in run.stderr  # a clean run removes its files
