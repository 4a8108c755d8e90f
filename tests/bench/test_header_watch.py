"""The header-watch benchmark (``bench/header_watch.py``) end to end with a few
transactions: two broker processes on a private etcd per mode, and the counts it prints
hold what the scoped mode promises (B, which serves none of the segments, hears nothing)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "header_watch.py"


@pytest.mark.slow
def test_the_benchmark_counts_each_brokers_header_events() -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--count", "5"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = run.stdout
    assert run.returncode == 0, out + run.stderr
    rows = {
        m[1]: (int(m[2]), int(m[3]), int(m[4]), int(m[5]))
        for m in re.finditer(r"^(prefix|scoped) +(\d+) +(\d+) +(\d+) +(\d+) +[\d.]+$", out, re.M)
    }
    # (A events, B events, B segments, A watches left)
    assert rows["prefix"] == (10, 10, 0, 0), out  # each opened and committed, seen by both
    assert rows["scoped"] == (5, 0, 0, 0), out  # A: each commit; B: nothing
