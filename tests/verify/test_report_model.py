"""The report's view of a run: zero-filled rates, the gauges, the marks, where anomaly
samples sit in time, the verdict and the configuration; and the SVG drawn from it."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from segtxn.verify.checker import ANOMALIES, Report
from segtxn.verify.report.model import Mark, build, latency_per_second, per_second
from segtxn.verify.report.page import render
from segtxn.verify.report.svg import Series, plot
from segtxn.verify.stats import marks
from segtxn.verify.workload import RunInfo

T0 = 1_800_000_000.0
SVG = "{http://www.w3.org/2000/svg}"


def test_per_second_counts_fill_empty_seconds_with_zero() -> None:
    events = [(0.5, 2.0), (0.7, 1.0), (3.2, 4.0), (-0.1, 9.0), (5.0, 9.0)]
    assert per_second(events, 5) == [(0.0, 3.0), (1.0, 0.0), (2.0, 0.0), (3.0, 4.0), (4.0, 0.0)]
    assert per_second([], 3) == [(0.0, 0.0), (1.0, 0.0), (2.0, 0.0)]


def test_latency_per_second_is_only_where_something_committed() -> None:
    points = [(0.1, 5.0), (0.2, 7.0), (0.3, 100.0), (4.5, 3.0)]
    by = latency_per_second(points)
    assert by["p50"] == [(0.5, 7.0), (4.5, 3.0)]
    assert by["max"] == [(0.5, 100.0), (4.5, 3.0)]


def test_marks_end_at_the_restart_the_sigcont_or_etcds_start() -> None:
    def row(ts: float, kind: str, **fields: str) -> dict[str, object]:
        base: dict[str, object] = dict.fromkeys(
            ("op", "topic", "victim", "fault", "target", "step")
        )
        return {**base, "ts": ts, "kind": kind, **fields}

    rows = [
        row(1.0, "topology", op="split", topic="topic://verify/r/input"),
        row(2.0, "killed", victim="b1"),
        row(2.0, "fault", fault="kill-server", target="b1", step="killed"),
        row(3.0, "fault", fault="stop-processor", target="p2", step="stopped"),
        row(4.5, "fault", fault="kill-server", target="b1", step="restarted"),
        row(6.0, "fault", fault="stop-processor", target="p2", step="continued"),
        row(7.0, "fault", fault="restart-etcd", target="etcd", step="etcd-stopped"),
        row(8.0, "fault", fault="restart-etcd", target="etcd", step="etcd-started"),
    ]
    assert [(m["what"], m["kind"], m["ts"], m["until"]) for m in marks(rows)] == [
        ("split input", "split", 1.0, None),
        ("kill b1", "kill", 2.0, 4.5),
        ("pause p2", "pause", 3.0, 6.0),
        ("stop etcd", "down", 7.0, 8.0),
    ]


def checked(counts: dict[str, int] | None = None) -> Report:
    """A checked run of 10 s: commits in seconds 0, 1 and 6 (nothing in between), a kill at
    3 s, gauges each second, and (with ``counts``) one aborted_read sample at 6.2 s."""
    counts = counts or {}
    report = Report(dict.fromkeys(ANOMALIES, 0) | counts, {}, times={})
    if counts.get("aborted_read"):
        report.samples["aborted_read"] = ["txn=T2, outcome=aborted"]
        report.times["aborted_read"] = [T0 + 6.2]
    report.stats = {
        "inputs_sent": 60,
        "inputs_stored": 60,
        "outputs_visible": 120,
        "transactions": {"committed": 3, "aborted": 1},
        "commit_ms": [4.0, 5.0, 9.0],
        "ended": [
            (T0 + 0.4, "committed", 20, 4.0),
            (T0 + 1.5, "committed", 20, 5.0),
            (T0 + 2.0, "aborted", 20, 1.0),
            (T0 + 6.1, "committed", 20, 9.0),
        ],
        "sent": [(T0 + 0.1, 30), (T0 + 0.9, 10), (T0 + 4.5, 20)],
        "gauges": [(T0 + s, 10 * s, {"input": 2 + (s > 5), "out-a": 2}) for s in range(1, 10)],
        "marks": [{"ts": T0 + 3.0, "what": "kill p1", "kind": "kill", "until": T0 + 3.5}],
        "span": (T0, T0 + 9.5),
    }
    return report


def info(drained: bool = True) -> RunInfo:
    config = {
        "seed": 7, "inputs": 60, "keys": 5, "rate": 6.0, "processors": 2, "batch": 20,
        "abort_rate": 0.1, "timeout_rate": 0.02, "txn_timeout_s": 3.0,
        "changes": [{"at": 0.2, "topic": "input", "op": "split"}],
        "faults": [{"kind": "kill-processor", "at": 0.3, "target": "p1", "hold_s": 0.0}],
    }  # fmt: skip
    return RunInfo("http://127.0.0.1:1", "r1", {}, config, T0, drained=drained, ended=T0 + 10)


def test_the_view_puts_everything_on_the_runs_clock() -> None:
    view = build(checked(), 10.0, info())
    assert view.duration_s == 9.5  # from the first recorded event to the last
    assert [v for _, v in view.throughput] == [20, 20, 0, 0, 0, 0, 20, 0, 0, 0]
    assert [v for _, v in view.fed] == [40, 0, 0, 0, 20, 0, 0, 0, 0, 0]
    assert view.outcomes["aborted"][2] == (2.0, 1.0)
    assert view.backlog[0] == (1.0, 10.0)
    assert view.active["input"][-1] == (9.0, 3.0) and view.active["out-b"] == []
    assert view.marks == [Mark(3.0, 3.5, "kill", "kill p1")]
    assert view.verdict.passed and view.verdict.headline == "PASS: no anomaly"
    config = dict(view.config)
    assert config["seed"] == "7" and config["faults"] == "kill-processor p1 at 30% of the feed"
    assert config["topology"] == "split input at 20% of the feed"


def test_a_failing_run_places_its_samples_and_says_why_it_failed() -> None:
    view = build(checked({"aborted_read": 3}), 10.0, info())
    assert not view.verdict.passed
    assert view.verdict.headline == "FAIL: 3 anomalies (aborted_read 3)"
    [point] = view.anomalies
    assert (point.kind, point.index) == ("aborted_read", 0)
    assert abs(point.at_s - 6.2) < 1e-6
    undrained = build(checked(), 10.0, info(drained=False)).verdict
    assert not undrained.passed and "not drained in time" in undrained.headline


def test_a_plot_has_axes_with_ticks_data_and_labelled_marks_in_separate_lanes() -> None:
    close = [Mark(3.0, None, "split", "split input"), Mark(3.2, None, "merge", "merge out-b")]
    svg = plot(
        [Series("s", [(0.0, 1.0), (1.0, 250.0)], "#000")],
        x_max=60.0,
        unit="",
        marks=close,
        anomalies=[],
        label="t",
    )
    root = ET.fromstring(svg)
    assert root.findall(f".//{SVG}path[@class='data']")
    ticks = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "tick"]
    assert "0 s" in ticks and "60 s" in ticks and "250" in ticks
    labels = {
        t.text: float(t.get("y", 0)) for t in root.iter(f"{SVG}text") if t.get("class") == "mark"
    }
    assert labels.keys() == {"split input", "merge out-b"}
    assert labels["split input"] != labels["merge out-b"]  # 0.2 s apart: one above the other
    beyond = plot([Series("s", [(0.5, 1.0), (60.5, 2.0)], "#000")], x_max=60.0, unit="",
                  marks=[], anomalies=[], label="b")  # fmt: skip
    [line] = ET.fromstring(beyond).findall(f".//{SVG}path[@class='data']")
    end_x = float(line.get("d", "").split()[-1][1:].split(",")[0])
    assert end_x == 960 - 24  # drawn at the axis's end, not past it
    empty = plot([Series("s", [], "#000")], x_max=5, unit="", marks=[], anomalies=[], label="e")
    assert "no data" in empty and "class='data'" not in empty


def test_the_page_stands_alone() -> None:
    page = render(checked({"aborted_read": 1}), 10.0, info())
    # nothing to fetch: no script, stylesheet, image or font from anywhere
    assert not any(tag in page for tag in ("<script", "<link", "<img", "src=", "href=", "url("))
    assert page.count("<svg") == 6 and "FAIL: 1 anomalies" in page


def test_the_configuration_shows_what_run_json_has() -> None:
    """Seed 0 is a seed; a run.json from an older version shows the fields it has."""
    run = info()
    run.config["seed"] = 0
    assert dict(build(checked(), 10.0, run).config)["seed"] == "0"
    old = RunInfo("http://127.0.0.1:1", "r0", {}, {}, T0, drained=True)
    assert [label for label, _ in build(checked(), 10.0, old).config] == [
        "started", "run time", "time axis", "run", "cluster", "drained",
    ]  # fmt: skip
