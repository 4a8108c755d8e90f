"""`segtxn verify soak`, run as a user runs it: two seeds with a short feed, real processes,
real etcd, faults included; and its refusals of bad input.

Seed 2456 is a cluster on a private etcd whose etcd is restarted and whose broker b1, then
its coordinator, are SIGKILLed after a commit and restarted; seed 2457 is a standalone on the
embedded store with two processors SIGSTOPped past their transaction timeout (zombies) and one
SIGKILLed, with splits and merges of the input and an output. The test checks what the harness
promises: one line per run, the table, ``soak.json``, every process's log with every
incarnation, the faults in the logs and histories, the reports, an exit status that follows
the verdicts. The standalone seed must pass. The restart seed's verdict is the product's: today
it can fail on bugs the soak found (a client start-up lookup that gives up while its broker or
etcd restarts; consumed ledgers trimmed before the check reads them), which is what the soak
is for; here it must only have run its faults.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from segtxn.verify.processes import MARKER

SEGTXN = str(Path(sys.executable).with_name("segtxn"))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_short_soak_runs_each_seed_with_its_faults(tmp_path: Path) -> None:
    command = [SEGTXN, "verify", "soak", "--seed", "2456", "--runs", "2", "--duration", "8"]
    command += ["--rate", "50", "--drain-timeout", "45", "--out", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=880, check=False)
    out, err = result.stdout, result.stderr
    saved = json.loads((tmp_path / "soak.json").read_text())
    runs = {run["seed"]: run for run in saved["runs"]}
    assert sorted(runs) == [2456, 2457], out + err[-3000:]
    assert runs[2457]["passed"], out + (tmp_path / "seed-2457" / "report.txt").read_text()
    assert result.returncode == (0 if runs[2456]["passed"] else 1), out + err[-3000:]
    assert "Traceback" not in out + err

    lines = out.splitlines()
    assert lines[0].startswith("soak: 2 run(s), seeds 2456..2457, 8 s of feed at 50/s")
    assert lines[1].startswith("[1/2] seed 2456 ") and "cluster-etcd" in lines[1]
    faults = (
        "restart-etcd:etcd@0.20/1.4s kill-server:b1@0.62/1.5s kill-server:coordinator@0.73/4.7s"
    )
    assert f"faults {faults}" in lines[1]
    assert lines[2].startswith("[2/2] seed 2457 PASS ") and "standalone-memory" in lines[2]
    assert "anomalies none" in lines[2]
    table = lines[lines.index("") + 1 :]
    assert table[0].split() == [
        "seed", "result", "time", "shape", "procs", "txns", "faults", "anomalies"
    ]  # fmt: skip
    assert table[2].split()[:2] == ["2457", "PASS"]
    if not runs[2456]["passed"]:
        assert "FAIL: 1 of 2 run(s): seeds 2456" in out
        assert "reproduce one: segtxn verify soak --runs 1 --duration 8 --rate 50 " in out
        assert "--seed 2456" in out

    cluster, standalone = tmp_path / "seed-2456", tmp_path / "seed-2457"
    assert sorted(p.name for p in (cluster / "logs").iterdir()) == [
        "b1.log", "b2.log", "coordinator.log", "etcd.log", "orchestrator.log",
        "p1.log", "p2.log", "p3.log",
    ]  # fmt: skip
    b1 = (cluster / "logs" / "b1.log").read_text()
    assert "b1: incarnation 1 SIGKILLed (fault kill-server:b1@0.62/1.5s, " in b1
    assert "b1: incarnation 2 (restart after SIGKILL" in b1
    assert "-v broker --store etcd://" in b1 and "--broker-id b1" in b1
    assert "INFO segtxn.broker.service" in b1  # servers log at INFO into their files
    etcd = (cluster / "logs" / "etcd.log").read_text()
    assert f"{MARKER} etcd" in etcd and "starting again" in etcd
    steps = [
        (e["fault"], e["step"])
        for e in map(json.loads, (cluster / "history" / "orchestrator.jsonl").open())
        if e["kind"] == "fault"
    ]
    assert steps == [
        ("restart-etcd", "etcd-stopped"),
        ("restart-etcd", "etcd-started"),
        ("kill-server", "killed"),
        ("kill-server", "restarted"),
        ("kill-server", "killed"),  # the coordinator
        ("kill-server", "restarted"),
    ]
    coordinator = (cluster / "logs" / "coordinator.log").read_text()
    assert "coordinator: incarnation 1 SIGKILLed (fault kill-server:coordinator@0.73/4.7s, " in (
        coordinator
    )

    assert sorted(p.name for p in (standalone / "logs").iterdir()) == [
        "orchestrator.log", "p1.log", "p2.log", "p3.log", "standalone.log",
    ]  # fmt: skip
    p2 = (standalone / "logs" / "p2.log").read_text()
    assert "p2: SIGSTOP for 5.1 s" in p2 and "p2: SIGCONT" in p2
    assert "p2: incarnation 2 (restart after SIGKILL (kill-processor:p2@0.66))" in p2
    assert "-v verify process" in p2
    for run in (cluster, standalone):
        assert (run / "run.json").exists() and (run / "history" / "feeder.jsonl").exists()
    report = (standalone / "report.txt").read_text()
    assert "PASS: no anomaly" in report and "kill p2" in report and "merge input" in report
    assert "pause p2" in report  # a SIGSTOP is a fault the report marks too
    assert (standalone / "report.html").read_text().count("<svg") == 6  # timeline, 5 plots


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_soak_run_recorded_in_topics_passes_with_no_history_file(tmp_path: Path) -> None:
    """Seed 2457 (zombies, a SIGKILLed processor, splits and merges) with every history in
    the run's history topic: the checker reads them back through the data source."""
    command = [SEGTXN, "verify", "soak", "--seed", "2457", "--runs", "1", "--duration", "8"]
    command += ["--rate", "50", "--drain-timeout", "45", "--out", str(tmp_path)]
    command += ["--history", "topics"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=880, check=False)
    run = tmp_path / "seed-2457"
    report = (run / "report.txt").read_text()
    assert result.returncode == 0, result.stdout + report + result.stderr[-3000:]
    assert not (run / "history").exists()
    assert json.loads((run / "run.json").read_text())["config"]["history"] == "topics"
    # what only the histories tell (outcomes, the kill, the merges) came from the topic
    assert "PASS: no anomaly" in report and "kill p2" in report and "merge input" in report
    assert "committed " in report.split("transactions: ", 1)[1].splitlines()[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--runs", "0"], "Invalid value for '--runs'"),
        (["--duration", "0"], "Invalid value for '--duration'"),
        (["--seed", "-3"], "Invalid value for '--seed'"),
        (["--rate", "fast"], "Invalid value for '--rate'"),
        (["--inject-bug", "a b"], "Invalid value for '--inject-bug'"),
        (["--inject-bug", ""], "Invalid value for '--inject-bug'"),
    ],
)
def test_soak_refuses_bad_input_with_a_usage_error(args: list[str], message: str) -> None:
    result = subprocess.run(
        [SEGTXN, "verify", "soak", *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
