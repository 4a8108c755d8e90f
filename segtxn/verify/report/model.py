"""The report's data: a checked run turned into what the page shows, in seconds since the
first event the run recorded (the feed's start; the run's own start, with the processors
starting, is a few seconds earlier).

:func:`build` takes the checker's :class:`~segtxn.verify.checker.Report` (its counts,
samples and :mod:`stats <segtxn.verify.stats>`) and the run's :class:`RunInfo` and gives a
:class:`RunView`: the verdict, the configuration as label/value rows, and every plotted
series. Rates are per whole second and zero-filled (:func:`per_second`): a second with no
commit is a zero on the plot, not a gap the line skips, so the dip after a kill shows.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from segtxn.verify.checker import ANOMALIES, Report
from segtxn.verify.workload import RunInfo

Points = list[tuple[float, float]]
OUTCOMES = ("committed", "aborted", "timed_out", "commit_failed")
TOPIC_ROLES = ("input", "out-a", "out-b")


@dataclass(frozen=True)
class Verdict:
    passed: bool
    headline: str
    """``PASS: no anomaly`` or ``FAIL: ...`` (the terminal report's last line, and more)."""
    details: list[str]


@dataclass(frozen=True)
class Mark:
    """A fault or topology change: from ``at_s`` (to ``until_s``, for a pause or a
    downtime); ``kind`` one of :data:`segtxn.verify.stats.MARK_KINDS`."""

    at_s: float
    until_s: float | None
    kind: str
    label: str


@dataclass(frozen=True)
class AnomalyPoint:
    """Sample ``index`` of anomaly ``kind``, placed at ``at_s`` (see ``Report.times``)."""

    at_s: float
    kind: str
    index: int
    sample: str


@dataclass
class RunView:
    verdict: Verdict
    config: list[tuple[str, str]]
    duration_s: float
    """The x axis's end: from the first recorded event to the last."""
    throughput: Points
    """Committed inputs per second (zero-filled)."""
    fed: Points
    """Inputs stored per second (zero-filled): what the processors had to keep up with."""
    backlog: Points
    active: dict[str, Points]
    outcomes: dict[str, Points]
    latency: dict[str, Points]
    """``p50``, ``p99`` and ``max`` commit latency (ms) of the transactions committed in
    each second (seconds without a commit have no point)."""
    marks: list[Mark] = field(default_factory=list)
    anomalies: list[AnomalyPoint] = field(default_factory=list)


def per_second(events: Iterable[tuple[float, float]], seconds: int) -> Points:
    """The sum of the values of ``(t, value)`` events in each whole second ``[0, seconds)``
    (the second ``floor(t)``), zeros included; an event outside the range is dropped."""
    sums = [0.0] * max(0, seconds)
    for t, value in events:
        second = math.floor(t)
        if 0 <= second < len(sums):
            sums[second] += value
    return [(float(s), v) for s, v in enumerate(sums)]


def percentile(values: list[float], p: float) -> float:
    """The ``p`` quantile (0..1) of ``values`` by rank (0 for none)."""
    if not values:
        return 0.0
    return sorted(values)[min(len(values) - 1, int(len(values) * p))]


def verdict(report: Report, info: RunInfo | None) -> Verdict:
    stats = report.stats
    outcomes: dict[str, int] = stats.get("transactions", {})
    problems = [f"{name} {n:,}" for name, n in report.counts.items() if n]
    if not stats.get("inputs_stored", 0) or not outcomes.get("committed", 0):
        problems.append("nothing checked (no input stored, or no transaction committed)")
    if info is not None and info.crashed:
        problems.append(
            "processors exited by themselves: "
            + ", ".join(
                f"{p} (exit {', '.join(map(str, codes))})" for p, codes in info.crashed.items()
            )
        )
    if info is not None and not info.drained:
        # the backlog is counted again once the processors stopped: 0 means they consumed
        # everything, only later than the drain timeout (overloaded rather than stuck)
        problems.append(
            f"not drained in time ({len(info.leftover):,} inputs still unacknowledged "
            "when the processors stopped)"
        )
    if report.anomalies == 0 and not problems:
        headline = "PASS: no anomaly"
    elif report.anomalies == 0:
        headline = "FAIL: " + "; ".join(problems)
    else:
        headline = f"FAIL: {report.anomalies:,} anomalies ({', '.join(problems)})"
    details = [
        f"{stats.get('inputs_sent', 0):,} inputs sent, {stats.get('inputs_stored', 0):,} "
        f"stored; {stats.get('outputs_visible', 0):,} outputs visible",
        "transactions: " + (", ".join(f"{o} {n:,}" for o, n in sorted(outcomes.items())) or "none"),
        f"checked {len(ANOMALIES)} anomaly kinds in {stats.get('check_s', 0)} s",
    ]
    return Verdict(report.anomalies == 0 and not problems, headline, details)


def configuration(
    info: RunInfo | None, run_s: float, started: float, origin: float
) -> list[tuple[str, str]]:
    """The run's configuration (``run.json``) as label/value rows; ``origin``: the plots'
    time 0."""
    rows = [
        ("started", time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started))),
        ("run time", f"{run_s:.1f} s"),
        ("time axis", f"0 s is the first recorded event, {origin - started:.1f} s after the start"),
    ]
    if info is None:
        return rows
    c = info.config
    described = [
        ("run", info.run),
        ("seed", c.get("seed")),
        ("cluster", info.url),
        (
            "inputs",
            "inputs" in c and f"{c['inputs']:,} over {c.get('keys')} keys at {c.get('rate')}/s",
        ),
        (
            "processors",
            "processors" in c and f"{c['processors']}, {c.get('batch')} inputs per transaction",
        ),
        (
            "transactions",
            "abort_rate" in c
            and f"aborted on purpose {c['abort_rate']:.0%}, stalled past the timeout "
            f"{c.get('timeout_rate', 0):.0%}, timeout {c.get('txn_timeout_s')} s",
        ),
        ("topology", "changes" in c and _planned(c["changes"], "op", "topic")),
        ("faults", "faults" in c and _planned(c["faults"], "kind", "target")),
        (
            "drained",
            "yes"
            if info.drained
            else f"not in time; {len(info.leftover):,} inputs left when the processors stopped",
        ),
    ]
    # a run.json from an older version may lack some: what it has is shown
    shown = [
        (label, value) for label, value in described if value is not None and value is not False
    ]
    return rows + [(label, str(value)) for label, value in shown]


def _planned(items: list[dict[str, Any]], what: str, target: str) -> str:
    """A plan's changes or faults: ``split input at 20%, kill-processor p1 at 45%``."""
    parts = [f"{i[what]} {i[target]} at {i['at']:.0%} of the feed" for i in items]
    return ", ".join(parts) or "none"


def build(report: Report, run_s: float, info: RunInfo | None = None) -> RunView:
    """The view of a checked run (``info``: its ``run.json``, when the report has it)."""
    stats = report.stats
    started = info.started if info is not None and info.started else None
    span = stats.get("span") or (started or time.time(),) * 2
    # time 0 is the first recorded event (the feed's start): the seconds before it, while
    # the processors start, have nothing to draw
    origin = span[0]
    duration = max(span[1] - origin, 1.0)
    seconds = math.floor(duration) + 1
    ended: list[tuple[float, str, int, float | None]] = stats.get("ended", [])
    committed = [(ts - origin, n, ms) for ts, o, n, ms in ended if o == "committed"]
    outcomes = {
        outcome: per_second(((ts - origin, 1.0) for ts, o, _, _ in ended if o == outcome), seconds)
        for outcome in OUTCOMES
    }
    gauges: list[tuple[float, int, dict[str, int]]] = stats.get("gauges", [])
    marks = [
        Mark(
            m["ts"] - origin,
            None if m.get("until") is None else m["until"] - origin,
            m.get("kind", ""),
            m["what"],
        )
        for m in stats.get("marks", [])
    ]
    anomalies = [
        AnomalyPoint(at - origin, kind, i, report.samples[kind][i])
        for kind, times in report.times.items()
        for i, at in enumerate(times)
        if at is not None
    ]
    return RunView(
        verdict=verdict(report, info),
        config=configuration(info, run_s, started or origin, origin),
        duration_s=duration,
        throughput=per_second(((t, float(n)) for t, n, _ in committed), seconds),
        fed=per_second(((ts - origin, float(n)) for ts, n in stats.get("sent", [])), seconds),
        backlog=[(ts - origin, float(backlog or 0)) for ts, backlog, _ in gauges],
        active={
            role: [(ts - origin, float(a[role])) for ts, _, a in gauges if role in a]
            for role in TOPIC_ROLES
        },
        outcomes=outcomes,
        latency=latency_per_second([(t, ms) for t, _, ms in committed if ms is not None]),
        marks=marks,
        anomalies=anomalies,
    )


def latency_per_second(points: list[tuple[float, float]]) -> dict[str, Points]:
    """p50, p99 and max of the ``(t, ms)`` latencies in each second that has any."""
    by_second: dict[int, list[float]] = {}
    for t, ms in points:
        by_second.setdefault(math.floor(t), []).append(ms)
    out: dict[str, Points] = {"p50": [], "p99": [], "max": []}
    for second in sorted(by_second):
        values = by_second[second]
        out["p50"].append((second + 0.5, percentile(values, 0.5)))
        out["p99"].append((second + 0.5, percentile(values, 0.99)))
        out["max"].append((second + 0.5, max(values)))
    return out
