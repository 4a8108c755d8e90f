"""`segtxn demo`, run as a user runs it: a real process, at small scale, on each kind of store.
It must report zero anomalies (the checker itself is tested to catch each kind)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SEGTXN = str(Path(sys.executable).with_name("segtxn"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("store", "trace"), [("memory://", True), ("etcd-local", False)])
def test_demo_runs_the_pipeline_and_finds_no_anomaly(
    store: str, trace: bool, tmp_path: Path
) -> None:
    """On memory with ``--trace`` (every transaction sampled here): the guarantees hold with
    tracing on, and the processes' logs hold their spans."""
    command = [SEGTXN, "demo", "--store", store, "--duration", "6", "--rate", "50"]
    command += ["--processors", "2", "--seed", "7", "--master", "local[2]", "--out", str(tmp_path)]
    command += ["--trace"] if trace else []
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_TRACES_SAMPLER"] = "always_on"
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=280, check=False, env=env
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr[-3000:]
    assert "seed 7" in out
    assert "300 inputs sent, 300 stored" in out
    assert "PASS: no anomaly" in out
    assert "kill p1" in out and "split input" in out and "merge out-b" in out
    (report,) = tmp_path.glob("*/report.html")
    page = report.read_text()
    assert page.count("<svg") == 6 and "PASS: no anomaly" in page  # a timeline and 5 plots
    assert "kill p1" in page and "split input" in page  # the faults, marked
    # make test installs chromium: the screenshot is kept next to the page
    assert report.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
    assert f"its screenshot: {report.with_suffix('.png')}" in out
    spans = [
        json.loads(line)
        for log in tmp_path.glob("*/logs/*.log")
        for line in log.read_text().splitlines()
        if line.startswith('{"name": ')
    ]
    names = {span["name"] for span in spans}
    if not trace:
        assert not spans
        return
    assert {"transaction", "new-txn", "end-txn"} <= names  # processors and the coordinator
    assert any(n.startswith("materialize writes segment://verify/") for n in names)
    services = {span["resource"]["attributes"]["service.name"] for span in spans}
    assert {"segtxn-standalone", "segtxn-verify"} <= services


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
