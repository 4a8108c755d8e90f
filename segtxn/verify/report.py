"""The checker's report: a text summary for the terminal and an HTML page with two plots
(commit latency histogram; committed inputs per second, with splits, merges and kills marked).
The plots are inline SVG: the page stands alone, with nothing to fetch."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from segtxn.verify.checker import ANOMALIES, Report


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
        lines.extend(f"      e.g. {sample}" for sample in report.samples.get(name, []))
    verdict = "PASS: no anomaly" if report.anomalies == 0 else f"FAIL: {report.anomalies} anomalies"
    lines.append(verdict)
    return "\n".join(lines)


def write_html(report: Report, run_s: float, path: Path) -> None:
    stats = report.stats
    body = [
        "<h1>segtxn verification</h1>",
        f"<pre>{html.escape(summary(report, run_s))}</pre>",
        "<h2>Commit latency (committed transactions)</h2>",
        _histogram(stats.get("commit_ms", [])),
        "<h2>Committed inputs per second</h2>",
        _timeline(stats.get("throughput", []), stats.get("marks", [])),
    ]
    path.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>segtxn verification</title>"
        "<style>body{font-family:sans-serif;margin:2em}pre{background:#f4f4f4;padding:1em}"
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
