"""`segtxn demo`, run as a user runs it: a real process, on each kind of store."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SEGTXN = str(Path(sys.executable).with_name("segtxn"))


@pytest.mark.parametrize("store", ["memory://", "etcd-local"])
def test_demo_runs_and_checks_itself(store: str) -> None:
    result = subprocess.run(
        [SEGTXN, "demo", "--store", store, "--messages", "2000", "--keys", "50", "--seed", "7"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "seed 7" in result.stdout
    assert "RESULT: every message once, per-key order kept, keys on their segments" in result.stdout
    assert "missing 0, backlog after acks 0, anomalies 0" in result.stdout


def test_demo_rejects_an_unknown_store() -> None:
    result = subprocess.run(
        [SEGTXN, "demo", "--store", "zookeeper://nowhere"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "unknown metadata store URL" in result.stderr
    assert "Traceback" not in result.stderr
