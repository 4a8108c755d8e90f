"""The checker's self-test: a clean recorded run passes, and each anomaly kind injected into
it is caught. A checker that cannot fail proves nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from segtxn.verify.checker import ANOMALIES, anomaly_frames, check, sample_entries
from segtxn.verify.locate import PLACES
from segtxn.verify.report import summary, write_html
from tests.verify.runs import INPUT_IDS, Run, input_id


def aborted_read(run: Run) -> None:
    run.output("a", 9, "k1", 0, "T2")  # the aborted attempt shows


def uncommitted_read(run: Run) -> None:
    run.output("a", 9, "k2", 0, "T9")  # a transaction never asked to commit


def torn_transaction(run: Run) -> None:
    run.outputs = [o for o in run.outputs if not (o[0] == "b" and o[8] == "T1" and o[6] == 1)]


def lost_write(run: Run) -> None:
    run.outputs = [o for o in run.outputs if o[8] != "T3"]


def duplicate(run: Run) -> None:
    run.output("a", 9, "k0", 1, "T1")


def acked_without_output(run: Run) -> None:
    run.inputs.append((0, 1, 20, input_id("k2", 0), "k2", 0))


def unacked_committed(run: Run) -> None:
    run.leftover.append(input_id("k0", 0))


def order_violation(run: Run) -> None:
    a = [o for o in run.outputs if o[0] == "a"]
    first, second = a[0], a[1]  # k0:0 and k0:1: swap where they are stored
    swapped = [
        (*first[:3], second[3], second[4], *first[5:]),
        (*second[:3], first[3], first[4], *second[5:]),
    ]
    run.outputs = [o for o in run.outputs if o not in (first, second)] + swapped


def non_monotonic_read(run: Run) -> None:
    for e in run.events:
        if e["kind"] == "ended" and e["txn"] == "T1":
            e["inputs"] = list(reversed(e["inputs"]))


INJECTIONS: dict[str, Callable[[Run], None]] = {
    "aborted_read": aborted_read,
    "uncommitted_read": uncommitted_read,
    "torn_transaction": torn_transaction,
    "lost_write": lost_write,
    "duplicate": duplicate,
    "acked_without_output": acked_without_output,
    "unacked_committed": unacked_committed,
    "order_violation": order_violation,
    "non_monotonic_read": non_monotonic_read,
}


def test_every_anomaly_kind_has_an_injection() -> None:
    assert set(INJECTIONS) == set(ANOMALIES)


def test_a_clean_run_passes(spark: SparkSession) -> None:
    report = check(Run.clean().frames(spark))
    assert report.counts == dict.fromkeys(ANOMALIES, 0)
    assert report.stats["transactions"] == {"committed": 2, "aborted": 1}
    assert report.stats["outputs_visible"] == 6


@pytest.mark.parametrize("kind", list(INJECTIONS))
def test_each_injected_anomaly_is_caught(spark: SparkSession, kind: str) -> None:
    run = Run.clean()
    INJECTIONS[kind](run)
    caught = anomaly_frames(run.frames(spark))[kind].collect()  # just this kind: faster
    assert caught, f"{kind} was injected and not caught"
    # Each row names entries to follow through the run's files; one the histories record
    # (a transaction or an input) comes first.
    entries = sample_entries(caught[0].asDict())
    assert entries and (entries[0].startswith("T") or entries[0] in INPUT_IDS), entries


@pytest.mark.timeout(600)  # the whole check (every query, the stats) on a shared machine
def test_a_report_names_an_anomalys_entries_and_where_they_appear(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The aborted T2's output shows: the report names T2, the output and the input it came
    from, and for each the history and log lines that mention it (file:line)."""
    run = Run.clean()
    aborted_read(run)
    histories = run.write(
        tmp_path,
        [
            "12:00:01 INFO segtxn.broker.service: loaded segment://t/out-a/0 on broker b1",
            "12:00:02 DEBUG segtxn.coordinator.v5: txn T2: ABORTED",
            "12:00:02 DEBUG segtxn.broker.txn.buffer: txn T2: ABORTED materialized on "
            "segment://t/out-a/0 (1 entries, 1:9..1:9)",
            "12:00:03 DEBUG segtxn.broker.txn.buffer: txn T20: ABORTED",  # not T2
        ],
    )
    report = check(run.frames(spark, tmp_path))
    assert report.counts["aborted_read"] == 1
    [entries] = report.entries["aborted_read"]
    source = input_id("k1", 0)
    assert entries == ["T2", source, "segment://t/out-a/0@1:9"]
    assert report.located is not None
    mentions = report.located.mentions

    def lines_of(client: str, entry: str, kind: str | None = None) -> list[str]:
        return [
            f"history/{client}.jsonl:{n}"
            for n, line in enumerate(histories[client], start=1)
            if entry in json.dumps(line) and kind in (None, line["kind"])
        ]

    [sent] = lines_of("feeder", source)
    received = lines_of("p1", source, "received")
    assert len(received) == 2  # T2 received it, then T3 did
    where = [str(place) for place in mentions[source].places]
    assert where == [sent, *lines_of("p1", source)[: PLACES - 1]]
    assert received[0] in where  # the first delivery (received, then ended with it in T2)
    assert [str(p) for p in mentions["T2"].logs] == [
        "logs/standalone.log:2",
        "logs/standalone.log:3",
    ]
    [begin] = lines_of("p1", "T2", "begin")
    assert str(mentions["T2"].history[0]) == begin
    # A broker line names the segment and the position separately: still a mention.
    assert [str(p) for p in mentions["segment://t/out-a/0@1:9"].places] == ["logs/standalone.log:3"]

    text = summary(report, 1.0)
    assert f"{source}: {sent}, {received[0]}" in text
    assert f"T2: {begin}, " in text and "logs/standalone.log:3" in text
    write_html(report, 1.0, tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text()
    assert "segment://t/out-a/0@1:9" in page and "logs/standalone.log:3</code>" in page
