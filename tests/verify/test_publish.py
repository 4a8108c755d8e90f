"""The verdict and report a VerificationRun's driver publishes: what goes in the ConfigMap,
a report too big for one, and the check's flag used wrongly."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from segtxn.cli.commands import main
from segtxn.verify.checker import Report
from segtxn.verify.publish import MAX_HTML_BYTES, Target, config_map, verdict

TARGET = Target(
    "ns",
    "r1-report",
    {"apiVersion": "segtxn.io/v1alpha1", "kind": "VerificationRun", "name": "r1", "uid": "u"},
)


def test_the_verdict_passes_only_a_clean_drained_run() -> None:
    clean = Report(counts={"duplicate": 0, "lost_write": 0}, samples={})
    dirty = Report(counts={"duplicate": 2, "lost_write": 0}, samples={})
    assert verdict(clean, drained=True)["passed"] is True
    assert verdict(clean, drained=False)["passed"] is False
    found = verdict(dirty, drained=True)
    assert (found["passed"], found["anomalies"], found["counts"]["duplicate"]) == (False, 2, 2)


def test_a_report_too_big_for_a_configmap_stays_on_the_volume(tmp_path: Path) -> None:
    path = tmp_path / "report.html"
    small = config_map(TARGET, {"passed": True}, "summary", "<html/>", path)
    assert small["data"]["report.html"] == "<html/>"
    assert json.loads(small["data"]["verdict.json"])["report"] == "configmap"
    assert small["metadata"]["ownerReferences"] == [TARGET.owner]
    big = config_map(TARGET, {"passed": True}, "summary", "x" * (MAX_HTML_BYTES + 1), path)
    assert "report.html" not in big["data"] and big["data"]["report.txt"] == "summary"
    found = json.loads(big["data"]["verdict.json"])
    assert (found["report"], found["reportPath"]) == ("volume", str(path))


def test_publishing_needs_the_html_report(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["verify", "check", "--run-dir", str(tmp_path), "--report-configmap", "r1-report"]
    )
    assert result.exit_code == 2
    assert "--report-configmap needs --html" in result.output
