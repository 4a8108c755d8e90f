"""The report page (``report.html``): one self-contained file, inline CSS and SVG, no script.

Top to bottom: the verdict banner; the run's configuration; the anomalies as a table (every
kind the checker looks for, with its count and samples, each sample's time on the run's
clock); the timeline of faults and anomaly samples; the plots (committed inputs per second,
backlog, active segments per topic, transaction outcomes per second, commit latency), all on
one x axis with the faults marked; then each sample's entries and where the run's files
mention them, and the terminal report. The view it draws is :mod:`.model`'s.
"""

from __future__ import annotations

import html
from pathlib import Path

from segtxn.verify.checker import ANOMALIES, Report
from segtxn.verify.report.model import RunView, build
from segtxn.verify.report.svg import Series, legend, plot, timeline
from segtxn.verify.report.text import sample_mentions, summary
from segtxn.verify.workload import RunInfo

OUTCOME_COLORS = {
    "committed": "#2e8b57",
    "aborted": "#9e9e9e",
    "timed_out": "#e67e22",
    "commit_failed": "#c0392b",
}
TOPIC_STYLES = {
    "input": ("#1f77b4", "", 5.0),
    "out-a": ("#ff7f0e", "", 2.5),
    "out-b": ("#6a3d9a", "6 4", 2.0),
}

CSS = """
body{font-family:sans-serif;margin:24px auto;max-width:1000px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 12px}h2{font-size:18px;margin:28px 0 8px}
h3{font-size:15px;margin:18px 0 2px}
.verdict{padding:14px 18px;border-radius:6px;color:#fff;margin-bottom:16px}
.verdict.pass{background:#2e7d32}.verdict.fail{background:#c62828}
.verdict .headline{font-size:24px;font-weight:bold}.verdict ul{margin:6px 0 0;padding-left:20px}
table{border-collapse:collapse;font-size:13px;width:100%}
td,th{border-bottom:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f2f2f2}table.config td:first-child{width:140px;color:#555}
tr.found td{background:#fdecea}tr.found td.count{color:#c62828;font-weight:bold}
td.count{text-align:right;width:60px}tr.none td{color:#888}
.samples{font-family:monospace;font-size:12px;margin:0;padding-left:18px}
.legend{font-size:12px;margin:2px 0 0 64px}.key{margin-right:16px;white-space:nowrap}
.swatch{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px}
.note{color:#555;font-size:13px}pre{background:#f4f4f4;padding:12px;font-size:12px;overflow:auto}
li li li{font-family:monospace;font-size:85%}
"""


def render(report: Report, run_s: float, info: RunInfo | None = None) -> str:
    """The whole page for a checked run (``info``: its ``run.json``, for the configuration
    and whether it drained)."""
    view = build(report, run_s, info)
    body = [
        "<h1>segtxn verification</h1>",
        _banner(view),
        "<h2>Configuration</h2>",
        _config(view),
        "<h2>Anomalies</h2>",
        _anomaly_table(report, view),
        "<h2>Timeline</h2>",
        "<p class='note'>Faults and topology changes (dashed; shaded while a process is "
        "paused or down), and where each anomaly sample happened (red triangles, also on "
        "every plot's time axis). Time is seconds since the first event the run recorded.</p>",
        timeline(view.marks, view.anomalies, x_max=view.duration_s),
        *_plots(view),
        _entries(report),
        "<h2>Terminal report</h2>",
        f"<pre>{html.escape(summary(report, run_s))}</pre>",
    ]
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>segtxn verification: {html.escape(view.verdict.headline)}</title>"
        f"<style>{CSS}</style></head><body>" + "\n".join(body) + "</body></html>\n"
    )


def write_html(report: Report, run_s: float, path: Path, info: RunInfo | None = None) -> None:
    path.write_text(render(report, run_s, info))


def _banner(view: RunView) -> str:
    verdict = view.verdict
    details = "".join(f"<li>{html.escape(d)}</li>" for d in verdict.details)
    return (
        f"<div class='verdict {'pass' if verdict.passed else 'fail'}' id='verdict'>"
        f"<div class='headline'>{html.escape(verdict.headline)}</div><ul>{details}</ul></div>"
    )


def _config(view: RunView) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in view.config
    )
    return f"<table class='config'>{rows}</table>"


def _anomaly_table(report: Report, view: RunView) -> str:
    """Every kind the checker looks for: found ones first, each with its samples and when."""
    when = {(a.kind, a.index): a.at_s for a in view.anomalies}
    kinds = sorted(ANOMALIES, key=lambda k: report.counts.get(k, 0) == 0)
    rows = []
    for kind in kinds:
        count = report.counts.get(kind, 0)
        samples = []
        for i, sample in enumerate(report.samples.get(kind, [])):
            at = when.get((kind, i))
            at_text = f"at {at:.1f} s" if at is not None else "time unknown"
            samples.append(f"<li>#{i + 1} {at_text}: {html.escape(sample)}</li>")
        if count > len(samples) and samples:
            samples.append(f"<li>... and {count - len(samples):,} more</li>")
        listed = f"<ol class='samples'>{''.join(samples)}</ol>" if samples else ""
        rows.append(
            f"<tr class='{'found' if count else 'none'}'><td>{kind}</td>"
            f"<td class='count'>{count:,}</td>"
            f"<td>{html.escape(ANOMALIES[kind])}{listed}</td></tr>"
        )
    head = "<tr><th>anomaly</th><th>count</th><th>what it means; samples</th></tr>"
    return f"<table class='anomalies' id='anomalies'>{head}{''.join(rows)}</table>"


def _plots(view: RunView) -> list[str]:
    committed = [
        Series("inputs stored (fed)", view.fed, "#aaaaaa", "step", "4 3", 1.5),
        Series("inputs committed (processed)", view.throughput, "#1f77b4", "step"),
    ]
    backlog = Series("inputs not yet consumed", view.backlog, "#6a3d9a")
    active = [
        Series(role, points, color, "line", dash, width)
        for role, points in view.active.items()
        for color, dash, width in [TOPIC_STYLES[role]]
    ]
    outcomes = [
        Series(o, points, OUTCOME_COLORS[o], "bars")
        for o, points in view.outcomes.items()
        if any(v for _, v in points)
    ]
    latency = [
        Series("max", view.latency["max"], "#bbbbbb", "dots"),
        Series("p50", view.latency["p50"], "#1f77b4"),
        Series("p99", view.latency["p99"], "#e67e22"),
    ]
    plots = [
        (
            "throughput",
            "Inputs per second: fed, and committed by the processors",
            committed,
            "",
            "",
        ),
        ("backlog", "Backlog: inputs stored, not yet consumed", [backlog], "", ""),
        ("active", "Active segments per topic", active, "", ""),
        ("outcomes", "Transaction outcomes per second", outcomes, "", ""),
        (
            "latency",
            "Commit latency (committed transactions, per second)",
            latency,
            " ms",
            "the commit call's duration as the processor measured it",
        ),
    ]
    out = []
    for name, title, series, unit, note in plots:
        svg = plot(
            series,
            x_max=view.duration_s,
            unit=unit,
            marks=view.marks,
            anomalies=view.anomalies,
            label=title,
        )
        note_html = f" <span class='note'>({html.escape(note)})</span>" if note else ""
        out.append(
            f"<section class='plot' id='plot-{name}'><h3>{html.escape(title)}{note_html}</h3>"
            f"{legend(series) if len(series) > 1 else ''}{svg}</section>"
        )
    return out


def _entries(report: Report) -> str:
    """Each anomaly's samples, their entries, and the lines that mention each entry."""
    parts = []
    for name in ANOMALIES:
        samples = report.samples.get(name, [])
        if not samples:
            continue
        items = []
        for i, sample in enumerate(samples):
            entries = []
            for entry, found in sample_mentions(report, name, i):
                places = [
                    f"<li><code>{html.escape(str(p))}</code> {html.escape(p.text)}</li>"
                    for p in (found.places if found else [])
                ]
                if found is not None and found.total > len(found.places):
                    places.append(f"<li>+{found.total - len(found.places)} more lines</li>")
                if found is not None and not found.places:
                    places.append("<li>not in the run's histories or logs</li>")
                entries.append(f"<li><b>{html.escape(entry)}</b><ul>{''.join(places)}</ul></li>")
            items.append(f"<li><code>{html.escape(sample)}</code><ul>{''.join(entries)}</ul></li>")
        parts.append(
            f"<h3>{html.escape(name)} ({report.counts.get(name, 0)})</h3><ol>{''.join(items)}</ol>"
        )
    if not parts:
        return ""
    return "<h2>Anomalies: entries and where the run's files mention them</h2>" + "".join(parts)
