"""The checker at its edges: ways a real violation (or a damaged record of a run) could
pass. Each failed before its fix (a review).

Each test feeds the checker a run that holds a violation, or whose record is damaged, and
asserts the checker says so (an anomaly, a failed verdict, or an error): a pass there is a
violation that would go unnoticed. Runs are built from :mod:`tests.verify.runs`' clean run;
where the checker reads files (``load``), real history files and ``run.json`` are written
and only the topics (which need a broker) are served from memory, by replacing
``checker.read_topic``.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from segtxn.verify import checker
from segtxn.verify.checker import ANOMALIES, Report, anomaly_frames, check, load, load_topics
from segtxn.verify.history import HistoryError, HistoryStore
from segtxn.verify.history_topic import history_topic
from segtxn.verify.processor import Topics
from segtxn.verify.publish import verdict as published_verdict
from segtxn.verify.ranges import SCHEMA
from segtxn.verify.report.model import verdict
from segtxn.verify.report.text import summary
from segtxn.verify.workload import RunInfo
from tests.verify.runs import Run, event, input_id, txn

RUN = "review"
TOPICS = Topics.for_run(RUN)


# -- a run's files, its topics served from memory --------------------------------------


def run_info(run: Run, **fields: Any) -> RunInfo:
    fed = sum(1 for e in run.events if e["kind"] == "sent")
    values: dict[str, Any] = {
        "url": "http://127.0.0.1:1",
        "run": RUN,
        "topics": {"input": TOPICS.input, "out_a": TOPICS.out_a, "out_b": TOPICS.out_b},
        "config": {"history": HistoryStore.FILES.value},
        "started": 0.0,
        "fed": fed,
        "feed_ended": 5.0,
        "drained": True,
        "ended": 10.0,
    }
    values.update(fields)
    return RunInfo(**values)


def source_rows(run: Run, history: list[bytes] | None = None) -> dict[str, list[tuple[Any, ...]]]:
    """What the ``segtxn`` data source would read of each topic, in its schema."""
    rows: dict[str, list[tuple[Any, ...]]] = {TOPICS.input: [], TOPICS.out_a: [], TOPICS.out_b: []}
    for segment, ledger, entry, id_, key, seq in run.inputs:
        value = json.dumps({"key": key, "seq": seq}).encode()
        rows[TOPICS.input].append((TOPICS.input, segment, ledger, entry, id_, key, value, 0))
    for out, segment, ledger, entry, message_id, key, seq, in_id, name, client in run.outputs:
        topic = TOPICS.out_a if out == "a" else TOPICS.out_b
        value = json.dumps(
            {"in_key": key, "in_seq": seq, "in_id": in_id, "txn": name, "client": client}
        ).encode()
        rows[topic].append((topic, segment, ledger, entry, message_id, key, value, 0))
    if history is not None:
        rows[history_topic(RUN)] = [
            (history_topic(RUN), 0, 1, n, f"segment://h/0@1:{n}", "c", line, 0)
            for n, line in enumerate(history)
        ]
    return rows


def serve_topics(
    monkeypatch: pytest.MonkeyPatch, spark: SparkSession, rows: dict[str, list[tuple[Any, ...]]]
) -> None:
    def read_topic(spark_: SparkSession, url: str, topic: str) -> DataFrame:
        return spark.createDataFrame(rows[topic], SCHEMA)

    monkeypatch.setattr(checker, "read_topic", read_topic)


def write_run(run_dir: Path, run: Run, info: RunInfo) -> None:
    run.write(run_dir, [])
    info.save(run_dir)


def caught(spark: SparkSession, load_it: Any) -> str | None:
    """What the checker says of a run: the anomalies it found, or the error it raised
    (None: it passed)."""
    try:
        report = check(load_it())
    except HistoryError as e:
        return f"error: {e}"
    finally:
        spark.catalog.clearCache()
    found = {k: v for k, v in report.counts.items() if v}
    return str(found) if found else None


# -- 1. a torn transaction is caught only when its history says "committed" -------------


@pytest.mark.parametrize("recorded", ["ended-lost", "commit_failed"])
def test_a_torn_transaction_is_caught_whatever_its_history_says(
    spark: SparkSession, recorded: str
) -> None:
    """T1 committed k0:0 and k0:1: out-a shows both outputs, out-b only k0:0. That is a
    torn transaction (atomicity broken) however T1's end was recorded: its processor was
    SIGKILLed after the commit, before ``ended`` (the demo's kill fault), or the commit call
    raised (``commit_failed``: either outcome allowed, but not half of each)."""
    run = Run.clean()
    run.outputs = [o for o in run.outputs if not (o[0] == "b" and o[8] == "T1" and o[6] == 1)]
    for e in run.events:
        if e["kind"] == "ended" and e["txn"] == "T1":
            e["outcome"] = "commit_failed"
    if recorded == "ended-lost":
        run.events = [e for e in run.events if not (e["kind"] == "ended" and e["txn"] == "T1")]
    counts = {k: len(v.collect()) for k, v in anomaly_frames(run.frames(spark)).items()}
    assert any(counts.values()), f"k0:1 is visible in out-a only, and nothing is found: {counts}"


# -- 2. an input fed but never recorded `sent` is never counted lost ---------------------


@pytest.mark.parametrize("how", ["sent-event-lost", "feeder-history-missing"])
def test_an_input_stored_then_lost_without_its_sent_event_is_caught(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """The feeder stored k1:0 (``fed`` 3 in run.json), then the cluster lost it: it never
    reached a processor and is not in the input topic. A history topic is in the cluster
    under test and can lose the ``sent`` event with the data (docs/verification.md), or the
    feeder's history file is missing. ``fed`` says 3 inputs were stored; the checker sees 2
    and passes."""
    run = Run.clean()
    lost = input_id("k1", 0)
    info = run_info(run)
    assert info.fed == 3
    run.inputs = [i for i in run.inputs if i[3] != lost]
    run.outputs = [o for o in run.outputs if o[7] != lost]
    run.events = [
        e for e in run.events if e["txn"] not in ("T2", "T3") and e["id"] != lost
    ]  # never delivered: no transaction took it
    if how == "feeder-history-missing":
        run.events = [e for e in run.events if e["client"] != "feeder"]
    write_run(tmp_path, run, info)
    serve_topics(monkeypatch, spark, source_rows(run))
    assert caught(spark, lambda: load(spark, tmp_path)) is not None, (
        "run.json says 3 inputs were stored, 2 are in the topic and the histories: a lost "
        "input passed unnoticed"
    )


# -- 3. an empty run passes ------------------------------------------------------------


def test_a_run_that_did_nothing_does_not_pass(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No input stored, no transaction, no output (a feeder that stored nothing, topics or
    histories that are not the run's): nothing was checked, so nothing was proved."""
    run = Run()
    info = run_info(run)
    (tmp_path / "history").mkdir()
    for client in ("feeder", "p1", "orchestrator"):
        (tmp_path / "history" / f"{client}.jsonl").write_text("")
    (tmp_path / "logs").mkdir()
    info.save(tmp_path)
    serve_topics(monkeypatch, spark, source_rows(run))
    try:
        report = check(load(spark, tmp_path))
    except HistoryError:
        return  # loud: fine
    finally:
        spark.catalog.clearCache()
    assert report.stats["inputs_stored"] == 0
    assert not verdict(report, info).passed, verdict(report, info).headline
    assert not published_verdict(report, info.drained, verdict(report, info).passed)["passed"]


# -- 4. a damaged history line is dropped without a word ---------------------------------


def timed_out_read(run: Run) -> list[dict[str, Any]]:
    """Add k2:0, taken by T4, which stalled past its timeout (``committing`` then the
    commit refused: ``ended`` timed_out), and whose outputs are visible anyway: an aborted
    read. Returns T4's events (placed before T3's, so T4's ``ended`` is not the last line of
    p1's history)."""
    run.events.append(event("sent", client="feeder", key="k2", seq=0, id=input_id("k2", 0)))
    run.inputs.append((0, 1, 20, input_id("k2", 0), "k2", 0))
    t4 = txn("T4", 2.5, "timed_out", [("k2", 0)])
    at = next(i for i, e in enumerate(run.events) if e["txn"] == "T3")
    run.events[at:at] = t4
    run.output("a", 10, "k2", 0, "T4")
    run.output("b", 10, "k2", 0, "T4")
    return t4


def test_the_aborted_read_is_caught_when_the_history_is_intact(spark: SparkSession) -> None:
    """The control for the damaged-history tests: T4's outputs are an aborted read."""
    run = Run.clean()
    timed_out_read(run)
    assert anomaly_frames(run.frames(spark))["aborted_read"].count() == 2


def test_the_harness_reads_intact_files_and_topics_as_the_checker_does(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control for the tests through ``load``/``load_topics``: with intact histories, the
    aborted read is caught from files and from a history topic, and a lost input whose
    ``sent`` event is there is caught too."""
    run = Run.clean()
    timed_out_read(run)
    info = run_info(run)
    write_run(tmp_path, run, info)
    serve_topics(monkeypatch, spark, source_rows(run))
    assert "aborted_read" in str(caught(spark, lambda: load(spark, tmp_path)))

    info = run_info(run, config={"history": HistoryStore.TOPICS.value})
    lines = [json.dumps({k: v for k, v in e.items() if v is not None}).encode() for e in run.events]
    run_event = {"kind": "run", "client": "orchestrator", "ts": 10.0, "info": asdict(info)}
    serve_topics(monkeypatch, spark, source_rows(run, [*lines, json.dumps(run_event).encode()]))
    assert "aborted_read" in str(caught(spark, lambda: load_topics(spark, info.url, RUN)))

    run = Run.clean()
    run.inputs = [i for i in run.inputs if i[3] != input_id("k1", 0)]
    write_run(tmp_path / "lost", run, run_info(run))
    serve_topics(monkeypatch, spark, source_rows(run))
    assert "lost_write" in str(caught(spark, lambda: load(spark, tmp_path / "lost")))


def damage(line: str) -> str:
    return line[: len(line) // 2]  # a line cut short, in the middle of the file


def test_a_damaged_line_in_a_history_file_is_not_dropped_silently(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """p1's history is damaged in its middle (not a torn last line, the one thing a SIGKILL
    leaves): the damaged line is T4's ``ended`` (timed_out). The file reader (Spark's JSON
    source, PERMISSIVE) turns it into a row of nulls and the checker drops it: T4's
    visible outputs, an aborted read, pass as an unknown outcome."""
    run = Run.clean()
    timed_out_read(run)
    write_run(tmp_path, run, run_info(run))
    path = tmp_path / "history" / "p1.jsonl"
    lines = path.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if '"T4"' in line and '"ended"' in line)
    assert at < len(lines) - 1  # in the middle: more lines follow
    lines[at] = damage(lines[at])
    path.write_text("".join(f"{line}\n" for line in lines))
    serve_topics(monkeypatch, spark, source_rows(run))
    assert caught(spark, lambda: load(spark, tmp_path)) is not None, (
        "a damaged history line hid an aborted read"
    )


def test_a_damaged_event_in_a_history_topic_is_not_dropped_silently(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same with the histories in the run's history topic (``load_topics``): a message
    that is not an event (the history topic is in the cluster under test) is dropped by
    ``from_json`` and the aborted read passes."""
    run = Run.clean()
    timed_out_read(run)
    info = run_info(run, config={"history": HistoryStore.TOPICS.value})
    lines = []
    for e in run.events:
        line = json.dumps({k: v for k, v in e.items() if v is not None})
        if e["kind"] == "ended" and e["txn"] == "T4":
            line = damage(line)
        lines.append(line.encode())
    run_event = {"kind": "run", "client": "orchestrator", "ts": 10.0, "info": asdict(info)}
    lines.append(json.dumps(run_event).encode())
    serve_topics(monkeypatch, spark, source_rows(run, lines))
    assert caught(spark, lambda: load_topics(spark, info.url, RUN)) is not None, (
        "a damaged history event hid an aborted read"
    )


# -- 5. the report's verdict ignores what run.json says failed ---------------------------


def clean_report() -> Report:
    return Report(dict.fromkeys(ANOMALIES, 0), {k: [] for k in ANOMALIES})


def test_the_reports_verdict_fails_a_run_whose_processor_crashed() -> None:
    """run.json records p2 as crashed (it exited by itself: docs/verification.md says that
    fails the run; ``JobResult.passed`` agrees). ``verify check`` exits on
    ``anomalies == 0 and drained``, and the report's banner, ``report.txt`` and the
    published verdict all say PASS."""
    info = run_info(Run.clean(), crashed={"p2": [1]})
    report = clean_report()
    assert not verdict(report, info).passed, verdict(report, info).headline
    assert not published_verdict(report, info.drained, verdict(report, info).passed)["passed"]


def test_the_text_report_does_not_say_pass_for_a_run_that_did_not_drain() -> None:
    """``report.txt`` (and what ``verify check`` prints) ends ``PASS: no anomaly`` for a
    run that did not drain, while the HTML banner says FAIL and the exit status is 1: the
    text never sees the run's info."""
    info = run_info(Run.clean(), drained=False, leftover=[input_id("k0", 0)])
    report = clean_report()
    assert not verdict(report, info).passed  # the HTML banner: right
    assert not summary(report, 1.0).endswith("PASS: no anomaly"), summary(report, 1.0)
