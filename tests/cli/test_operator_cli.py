"""`segtxn operator` as a process: it refuses clearly what it cannot run with."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.processes import SEGTXN


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "KUBERNETES"))}
    env["HOME"] = str(tmp_path)  # no ~/.kube/config
    return subprocess.run(
        [SEGTXN, "operator", *args], capture_output=True, text=True, env=env, timeout=60,
        check=False,
    )  # fmt: skip


def test_without_credentials_it_exits_saying_so(tmp_path: Path) -> None:
    done = run(tmp_path, "--standalone", "-n", "segtxn")
    assert done.returncode == 1
    assert "Error: no Kubernetes credentials" in done.stderr


def test_unreadable_kubeconfig_is_named(tmp_path: Path) -> None:
    env_file = tmp_path / "missing-kubeconfig"
    done = subprocess.run(
        [SEGTXN, "operator", "--standalone", "-A"],
        capture_output=True,
        text=True,
        env={**os.environ, "HOME": str(tmp_path), "KUBECONFIG": str(env_file)},
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "cannot read Kubernetes credentials" in done.stderr


def test_conflicting_scopes_are_a_usage_error(tmp_path: Path) -> None:
    done = run(tmp_path, "-n", "a", "--all-namespaces")
    assert done.returncode == 2
    assert "exclude each other" in done.stderr
