"""The checker's report as text, for the terminal and ``report.txt``: counts, outcomes, commit
latency, the faults, and every anomaly kind with its samples.

Under each anomaly's samples come the entries involved (transaction and message ids) and
where the run's files mention them (``history/p1.jsonl:812``, ``logs/broker-b1.log:40``):
the places to start reading when a run fails. The last line is the verdict."""

from __future__ import annotations

from segtxn.verify.checker import ANOMALIES, Report
from segtxn.verify.locate import Mentions
from segtxn.verify.report.model import percentile, verdict
from segtxn.verify.workload import RunInfo


def summary(report: Report, run_s: float, info: RunInfo | None = None) -> str:
    """The report as text; its last line is the run's verdict (:func:`verdict`: anomalies,
    and with ``info``, a run that did not drain or whose processors exited by themselves)."""
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
    lines.append(verdict(report, info).headline)
    return "\n".join(lines)


def sample_mentions(report: Report, name: str, i: int) -> list[tuple[str, Mentions | None]]:
    """The entries of sample ``i`` of anomaly ``name``, each with where it is mentioned
    (None: the run's files were not searched)."""
    entries = report.entries.get(name, [])
    row = entries[i] if i < len(entries) else []
    located = report.located
    return [(entry, located.mentions.get(entry) if located else None) for entry in row]


def _places(report: Report, name: str, i: int) -> list[str]:
    out = []
    for entry, mentions in sample_mentions(report, name, i):
        if mentions is None:
            out.append(entry)
        elif not mentions.places:
            out.append(f"{entry}: not in the run's histories or logs")
        else:
            more = mentions.total - len(mentions.places)
            extra = f" (+{more} more lines)" if more > 0 else ""
            out.append(f"{entry}: " + ", ".join(map(str, mentions.places)) + extra)
    return out
