"""What a run did, as the report shows it: counts, every transaction's end, the gauges the
orchestrator sampled, the faults and topology changes, and when each anomaly sample happened.

The checker (:mod:`.checker`) says whether the guarantees held; this module gathers the
run's story around that verdict, from the same frames, so the report
(:mod:`segtxn.verify.report`) can draw it over time without reading the files again. Every
timestamp is wall-clock seconds (``time.time()``, as the histories record them).

``stats`` keys (all plain, JSON-able values):

``inputs_sent``, ``inputs_stored``, ``outputs_visible``
    counts.
``transactions``
    ``{outcome: count}``.
``commit_ms``
    the committed transactions' commit call durations, sorted.
``ended``
    ``[(ts, outcome, inputs, commit_ms)]``, one per transaction end, by time.
``sent``
    ``[(ts, inputs)]``: the inputs stored, counted per tenth of a second (``ts`` its start).
``gauges``
    ``[(ts, backlog, {topic role: active segments})]``: the orchestrator's samples
    (``gauges`` events, about one a second while the run feeds and drains).
``marks``
    faults and topology changes, by time: ``{"ts", "what", "kind", "until"}`` with ``kind`` one
    of :data:`MARK_KINDS` and ``until`` the end of a pause or of a server's downtime (None for
    an instant).
``span``
    ``(first, last)``: the times of the first and last of those events and sends (None: the
    run recorded none).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

ORCHESTRATED = ("topology", "killed", "fault")
"""The orchestrator's events that become marks."""
DRAWN_COLUMNS = (
    "ts", "kind", "outcome", "commit_ms", "backlog", "active",
    "op", "topic", "victim", "fault", "target", "step",
)  # fmt: skip
"""The columns of the events the report draws (and ``n``: how many inputs an end has)."""
MARK_KINDS = ("kill", "pause", "down", "split", "merge")
"""kill: a process SIGKILLed (a processor, or a server: then ``until`` is its restart);
pause: a processor SIGSTOPped until its SIGCONT; down: etcd stopped until started again;
split, merge: a topology change."""


def run_stats(events: DataFrame, inputs: DataFrame, outputs: DataFrame) -> dict[str, Any]:
    """The stats of a run's ``events`` (every history) and its topics' frames.

    Four Spark jobs, whatever the run's size: the events the report draws one by one
    (transaction ends, gauges, faults and topology: a few per second), the sends per tenth of
    a second (there may be millions of sends), and the two topics' counts."""
    drawn = (
        events.where(F.col("kind").isin("ended", "gauges", *ORCHESTRATED))
        .select(*DRAWN_COLUMNS, F.size("inputs").alias("n"))
        .orderBy("ts")
        .collect()
    )
    sent = (
        events.where(F.col("kind") == "sent")
        .groupBy(F.floor(F.col("ts") * 10).alias("tenth"))
        .count()
        .orderBy("tenth")
        .collect()
    )
    ended = [(r["ts"], r["outcome"], r["n"], r["commit_ms"]) for r in drawn if r["kind"] == "ended"]
    outcomes: dict[str, int] = {}
    for _, outcome, _, _ in ended:
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    times = [r["ts"] for r in drawn] + [r["tenth"] / 10 for r in sent]
    return {
        "inputs_sent": sum(r["count"] for r in sent),
        "inputs_stored": inputs.count(),
        "outputs_visible": outputs.count(),
        "transactions": outcomes,
        "commit_ms": sorted(ms for _, outcome, _, ms in ended if outcome == "committed"),
        "ended": ended,
        "sent": [(r["tenth"] / 10, r["count"]) for r in sent],
        "gauges": [
            (r["ts"], r["backlog"], dict(r["active"] or {})) for r in drawn if r["kind"] == "gauges"
        ],
        "marks": marks([r.asDict() for r in drawn if r["kind"] in ORCHESTRATED]),
        "span": (min(times), max(times)) if times else None,
    }


def marks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The orchestrator's ``topology``, ``killed`` and ``fault`` events (by time) as marks: a
    kill ends at the victim's restart, a pause at its SIGCONT, etcd's downtime when it is
    started again."""
    out: list[dict[str, Any]] = []
    open_until: dict[str, dict[str, Any]] = {}
    for row in rows:
        ts, kind = row["ts"], row["kind"]
        if kind == "topology":
            topic = str(row["topic"]).rsplit("/", 1)[-1]
            out.append({"ts": ts, "what": f"{row['op']} {topic}", "kind": row["op"], "until": None})
        elif kind == "killed":
            out.append({"ts": ts, "what": f"kill {row['victim']}", "kind": "kill", "until": None})
            open_until[str(row["victim"])] = out[-1]
        elif row["step"] == "stopped":
            target = str(row["target"])
            out.append({"ts": ts, "what": f"pause {target}", "kind": "pause", "until": None})
            open_until[target] = out[-1]
        elif row["step"] == "etcd-stopped":
            out.append({"ts": ts, "what": "stop etcd", "kind": "down", "until": None})
            open_until["etcd"] = out[-1]
        elif row["step"] in ("restarted", "continued", "etcd-started"):
            mark = open_until.pop(str(row["target"]), None)
            if mark is not None:
                mark["until"] = ts
    return out


def entry_times(events: DataFrame, entries: list[str]) -> dict[str, float]:
    """When each of ``entries`` (transaction or message ids) first appears in the histories
    (as a ``txn`` or an ``id``); an entry no event names is left out."""
    if not entries:
        return {}
    named = F.when(F.col("txn").isin(entries), F.col("txn")).otherwise(F.col("id"))
    rows = (
        events.where(F.col("txn").isin(entries) | F.col("id").isin(entries))
        .select(named.alias("entry"), "ts")
        .groupBy("entry")
        .agg(F.min("ts").alias("ts"))
        .collect()
    )
    return {r["entry"]: r["ts"] for r in rows}
