"""The checker's report: a text summary for the terminal and an HTML page with two plots
(commit latency histogram; committed inputs per second, with splits, merges and kills marked).
The plots are inline SVG: the page stands alone, with nothing to fetch.

Under each anomaly's samples come the entries involved (transaction and message ids) and
where the run's files mention them (``history/p1.jsonl:812``, ``logs/broker-b1.log:40``):
the places to start reading when a run fails."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from segtxn.verify.checker import ANOMALIES, Report
from segtxn.verify.locate import Mentions


def percentile(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    return sorted(values)[min(len(values) - 1, int(len(values) * p))]


def summary(report: Report, run_s: float) -> str:
    stats = report.stats
    latencies: list[float] = stats.get("commit_ms", [])
    outcomes: dict[str, int] = stats.get("transactions", {})
    lines = [
        f"workload: {stats.get('inputs_sent', 0):,} inputs sent, "
        f"{stats.get('inputs_stored', 0):,} stored; {stats.get('outputs_visible', 0):,} "
        f"outputs visible; run {run_s:.0f} s",
        "transactions: " + ", ".join(f"{outcome} {n:,}" for outcome, n in sorted(outcomes.items())),
        f"commit latency: p50 {percentile(latencies, 0.5):.1f} ms, "
        f"p99 {percentile(latencies, 0.99):.1f} ms",
        "topology and faults: " + (", ".join(m["what"] for m in stats.get("marks", [])) or "none"),
        f"checker: {stats.get('check_s', 0)} s",
        "anomalies:",
    ]
    for name, description in ANOMALIES.items():
        count = report.counts.get(name, 0)
        lines.append(f"  {name:<22} {count:>6}   {description}")
        for i, sample in enumerate(report.samples.get(name, [])):
            lines.append(f"      e.g. {sample}")
            lines.extend(f"          {where}" for where in _places(report, name, i))
    if report.located is not None and report.located.truncated:
        lines.append("  (searched only the start of " + ", ".join(report.located.truncated) + ")")
    verdict = "PASS: no anomaly" if report.anomalies == 0 else f"FAIL: {report.anomalies} anomalies"
    lines.append(verdict)
    return "\n".join(lines)


def _mentions(report: Report, name: str, i: int) -> list[tuple[str, Mentions | None]]:
    """The entries of sample ``i`` of anomaly ``name``, each with where it is mentioned
    (None: the run's files were not searched)."""
    entries = report.entries.get(name, [])
    row = entries[i] if i < len(entries) else []
    located = report.located
    return [(entry, located.mentions.get(entry) if located else None) for entry in row]


def _places(report: Report, name: str, i: int) -> list[str]:
    out = []
    for entry, mentions in _mentions(report, name, i):
        if mentions is None:
            out.append(entry)
        elif not mentions.places:
            out.append(f"{entry}: not in the run's histories or logs")
        else:
            more = mentions.total - len(mentions.places)
            extra = f" (+{more} more lines)" if more > 0 else ""
            out.append(f"{entry}: " + ", ".join(map(str, mentions.places)) + extra)
    return out


def _anomalies_html(report: Report) -> str:
    """Each anomaly's samples, their entries, and the lines that mention each entry."""
    parts = []
    for name in ANOMALIES:
        samples = report.samples.get(name, [])
        if not samples:
            continue
        items = []
        for i, sample in enumerate(samples):
            entries = []
            for entry, mentions in _mentions(report, name, i):
                places = [
                    f"<li><code>{html.escape(str(p))}</code> {html.escape(p.text)}</li>"
                    for p in (mentions.places if mentions else [])
                ]
                if mentions is not None and mentions.total > len(mentions.places):
                    places.append(f"<li>+{mentions.total - len(mentions.places)} more lines</li>")
                if mentions is not None and not mentions.places:
                    places.append("<li>not in the run's histories or logs</li>")
                entries.append(f"<li><b>{html.escape(entry)}</b><ul>{''.join(places)}</ul></li>")
            items.append(f"<li><code>{html.escape(sample)}</code><ul>{''.join(entries)}</ul></li>")
        parts.append(
            f"<h3>{html.escape(name)} ({report.counts.get(name, 0)})</h3><ol>{''.join(items)}</ol>"
        )
    if not parts:
        return ""
    return "<h2>Anomalies: entries and where the run's files mention them</h2>" + "".join(parts)


def write_html(report: Report, run_s: float, path: Path) -> None:
    stats = report.stats
    body = [
        "<h1>segtxn verification</h1>",
        f"<pre>{html.escape(summary(report, run_s))}</pre>",
        _anomalies_html(report),
        "<h2>Commit latency (committed transactions)</h2>",
        _histogram(stats.get("commit_ms", [])),
        "<h2>Committed inputs per second</h2>",
        _timeline(stats.get("throughput", []), stats.get("marks", [])),
    ]
    path.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>segtxn verification</title>"
        "<style>body{font-family:sans-serif;margin:2em}pre{background:#f4f4f4;padding:1em}"
        "li li li{font-family:monospace;font-size:85%}"
        "</style></head><body>" + "\n".join(body) + "</body></html>"
    )


W, H, PAD = 720, 240, 40


def _histogram(values: list[float], bins: int = 30) -> str:
    if not values:
        return "<p>no committed transactions</p>"
    top = percentile(values, 0.99) or max(values) or 1.0
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, int(v / top * bins))] += 1
    most = max(counts)
    width = (W - 2 * PAD) / bins
    bars = [
        f"<rect x='{PAD + i * width:.1f}' y='{H - PAD - c / most * (H - 2 * PAD):.1f}' "
        f"width='{width - 1:.1f}' height='{c / most * (H - 2 * PAD):.1f}' fill='#4a7fb5'/>"
        for i, c in enumerate(counts)
    ]
    labels = [
        f"<text x='{PAD}' y='{H - 10}'>0 ms</text>",
        f"<text x='{W - PAD}' y='{H - 10}' text-anchor='end'>{top:.0f} ms (p99; the last bar "
        "holds the rest)</text>",
        f"<text x='{PAD}' y='{PAD - 10}'>{most} transactions</text>",
    ]
    return _svg(bars + labels)


def _timeline(points: list[tuple[int, int]], marks: list[dict[str, Any]]) -> str:
    if not points:
        return "<p>no committed transactions</p>"
    first, last = points[0][0], points[-1][0]
    span = max(1, last - first)
    most = max(n for _, n in points) or 1

    def x(second: float) -> float:
        return PAD + (second - first) / span * (W - 2 * PAD)

    path = " ".join(
        f"{'M' if i == 0 else 'L'}{x(s):.1f},{H - PAD - n / most * (H - 2 * PAD):.1f}"
        for i, (s, n) in enumerate(points)
    )
    shapes = [f"<path d='{path}' fill='none' stroke='#4a7fb5' stroke-width='2'/>"]
    for i, mark in enumerate(marks):
        mx = x(math.floor(mark["ts"]))
        shapes.append(
            f"<line x1='{mx:.1f}' x2='{mx:.1f}' y1='{PAD}' y2='{H - PAD}' stroke='#c0392b' "
            "stroke-dasharray='4 3'/>"
        )
        shapes.append(
            f"<text x='{mx + 3:.1f}' y='{PAD + 12 + 12 * (i % 4)}' font-size='11' "
            f"fill='#c0392b'>{html.escape(mark['what'])}</text>"
        )
    shapes += [
        f"<text x='{PAD}' y='{H - 10}'>0 s</text>",
        f"<text x='{W - PAD}' y='{H - 10}' text-anchor='end'>{span} s</text>",
        f"<text x='{PAD}' y='{PAD - 10}'>{most} inputs/s</text>",
    ]
    return _svg(shapes)


def _svg(parts: list[str]) -> str:
    axes = (
        f"<line x1='{PAD}' y1='{H - PAD}' x2='{W - PAD}' y2='{H - PAD}' stroke='#333'/>"
        f"<line x1='{PAD}' y1='{PAD}' x2='{PAD}' y2='{H - PAD}' stroke='#333'/>"
    )
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{W}' height='{H}' "
        f"font-family='sans-serif' font-size='12'>{axes}{''.join(parts)}</svg>"
    )
