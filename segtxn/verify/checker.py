"""The guarantee checker: Spark over the clients' histories and the topics' committed data.

:func:`load` reads a run: its histories (history files, JSON lines; or the run's history
topic) and the three topics through the ``segtxn`` data source; :func:`load_topics` reads a
run recorded in topics from the cluster alone (no file of the run: any executor reads its
partition of the histories as of the data). :func:`check` computes each anomaly kind in
:data:`ANOMALIES` as a DataFrame, counts it and keeps a few samples; a run passes when
every count is zero. The checks take frames, not files, so a test can inject any anomaly
into a recorded run and see the checker catch it, and both stores run the same checks. For
each sample, the report names the entries involved (message and transaction ids) and where
the run's histories and logs mention them (:mod:`.locate`).
"""

from __future__ import annotations

import functools
import json
import operator
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from segtxn.verify.history import HistoryError, HistoryStore
from segtxn.verify.history_topic import history_topic
from segtxn.verify.locate import MAX_LINES, Located, locate
from segtxn.verify.stats import entry_times, run_stats
from segtxn.verify.workload import RunInfo

ANOMALIES: dict[str, str] = {
    "aborted_read": "an output of an aborted transaction is visible (G1a)",
    "uncommitted_read": "an output of a transaction that was never asked to commit is visible",
    "torn_transaction": "a committed transaction is only partly visible",
    "lost_write": "a committed transaction's outputs, or a stored input, are missing",
    "duplicate": "one input produced more than one visible output in a topic",
    "acked_without_output": "an input was consumed (acknowledged) with no visible output",
    "unacked_committed": "an input is still unacknowledged though its output is committed",
    "order_violation": "a key's records are out of order in a topic (across splits and merges)",
    "non_monotonic_read": "a processor's committed inputs of one key went backwards",
}

EVENT_SCHEMA = (
    "kind string, client string, session string, ts double, key string, seq long, id string, "
    "txn string, outcome string, inputs array<struct<key: string, seq: long, id: string>>, "
    "outputs long, commit_ms double, topic string, op string, victim string, fault string, "
    "target string, step string, backlog long, fed long, active map<string,int>"
)
INPUT_VALUE = "key string, seq long"
OUTPUT_VALUE = "in_key string, in_seq long, in_id string, txn string, client string"
ABORTED = ("aborted", "timed_out")
SAMPLES = 5
ENTRY_COLUMNS = (
    "txn", "before_txn", "txns", "id", "in_id", "before_in_id", "message_id", "before_id",
    "message_ids",
)  # fmt: skip
"""The columns of an anomaly's rows that hold entries (transaction or message ids), in the
order the report lists them: the ones the histories record first."""
ENTRIES_PER_SAMPLE = 6


@dataclass
class Frames:
    """A run as DataFrames: ``events`` (all histories), ``inputs`` (the input topic),
    ``outputs`` (both output topics, column ``out`` = ``a`` | ``b``), ``leftover`` (input ids
    still unacknowledged after the run); ``run_dir``, where its history files and logs are;
    ``history``, a history topic's events as text (``client``, ``n``: the event's place in
    its client's history, ``line``), searched for the report's places too. With neither, the
    report names entries without their places. ``info``: the run, when loaded from one."""

    events: DataFrame
    inputs: DataFrame
    outputs: DataFrame
    leftover: DataFrame
    run_dir: Path | None = None
    history: DataFrame | None = None
    info: RunInfo | None = None


class RunNotRecorded(HistoryError):
    """The history topic holds no ``run`` event: the run has not finished (or never ran, or
    recorded its histories in files)."""


@dataclass
class Report:
    """``samples[kind][i]`` is a row of that kind as text; ``entries[kind][i]`` the ids in it,
    whose places are in ``located`` (when the run's files were searched)."""

    counts: dict[str, int]
    samples: dict[str, list[str]]
    stats: dict[str, Any] = field(default_factory=dict)
    entries: dict[str, list[list[str]]] = field(default_factory=dict)
    located: Located | None = None
    times: dict[str, list[float | None]] = field(default_factory=dict)
    """``times[kind][i]``: when sample ``i`` happened, wall-clock seconds: the first history
    event naming its first entry that any event names (entries come transactions first: an
    aborted read is placed where its transaction began, not where its input was sent); None:
    no history event names them. Where the report places it on the run's timeline."""

    @property
    def anomalies(self) -> int:
        return sum(self.counts.values())


def read_topic(spark: SparkSession, url: str, topic: str) -> DataFrame:
    return spark.read.format("segtxn").option("url", url).option("topic", topic).load()


def load(spark: SparkSession, run_dir: Path, url: str | None = None) -> Frames:
    """The run in ``run_dir`` (``run.json``), its topics read through ``url`` (by default the
    URL the run used); its histories where it recorded them (``run.json``'s ``history``):
    ``history/*.jsonl``, or its history topic (as :func:`load_topics`, with the logs of
    ``run_dir`` searched for the report)."""
    info = RunInfo.load(run_dir)
    url = url or info.url
    if info.history is HistoryStore.TOPICS:
        return load_topics(spark, url, info.run, run_dir)
    _check_history_files(run_dir / "history")
    events = spark.read.schema(EVENT_SCHEMA).json(str(run_dir / "history" / "*.jsonl"))
    return _frames(spark, events, info, url, run_dir)


def _check_history_files(directory: Path) -> None:
    """Raises HistoryError for a history line that is not an event, but a file's last one
    (torn by a SIGKILL): Spark's reader turned it into a row of nulls that no check saw,
    and an aborted read it recorded passed."""
    for path in sorted(directory.glob("*.jsonl")):
        lines = path.read_bytes().split(b"\n")
        while lines and not lines[-1].strip():
            lines.pop()
        for n, line in enumerate(lines[:-1], 1):
            try:
                json.loads(line)
            except ValueError as e:
                raise HistoryError(
                    f"{path}:{n} is not an event ({e}): the history is damaged"
                ) from e


def load_topics(spark: SparkSession, url: str, run: str, run_dir: Path | None = None) -> Frames:
    """Run ``run``, recorded in topics, from the cluster at ``url`` alone: its histories and
    its :class:`RunInfo` (the ``run`` event) from its history topic, its data from its three
    topics, all through the ``segtxn`` data source. ``run_dir``: where its logs are, if at
    hand (the report names the log lines that mention an anomaly's entries).

    Raises:
        RunNotRecorded: the history holds no ``run`` event.
    """
    raw = read_topic(spark, url, history_topic(run)).select(
        "segment", "ledger_id", "entry_id", F.col("value").cast("string").alias("line")
    )
    raw = raw.withColumn("client", F.get_json_object("line", "$.client")).cache()
    recorded = raw.where(F.get_json_object("line", "$.kind") == "run").collect()
    if not recorded:
        raise RunNotRecorded(
            f"{history_topic(run)} holds no run event: run {run!r} has not finished, or "
            "recorded its histories in files"
        )
    info = RunInfo(**json.loads(recorded[-1]["line"])["info"])
    events = raw.select(F.from_json("line", EVENT_SCHEMA).alias("e")).select("e.*")
    damaged = events.where(F.col("kind").isNull()).count()
    if damaged:
        raise HistoryError(
            f"{history_topic(run)}: {damaged} events are not events: the history is damaged"
        )
    events = events.where(F.col("kind") != "run")
    by_client = Window.partitionBy("client").orderBy("segment", "ledger_id", "entry_id")
    history = raw.withColumn("n", F.row_number().over(by_client)).select("client", "n", "line")
    frames = _frames(spark, events, info, url, run_dir)
    frames.history = history
    return frames


def _frames(
    spark: SparkSession, events: DataFrame, info: RunInfo, url: str, run_dir: Path | None
) -> Frames:
    """The run's frames, its histories' ``events`` already read (whatever kept them)."""
    inputs = read_topic(spark, url, info.topics["input"])
    inputs = inputs.withColumn("v", F.from_json(F.col("value").cast("string"), INPUT_VALUE))
    inputs = inputs.select(
        "segment", "ledger_id", "entry_id", F.col("message_id").alias("id"), "v.key", "v.seq"
    )
    outputs = None
    for out, topic in (("a", info.topics["out_a"]), ("b", info.topics["out_b"])):
        frame = read_topic(spark, url, topic).withColumn(
            "v", F.from_json(F.col("value").cast("string"), OUTPUT_VALUE)
        )
        frame = frame.select(
            F.lit(out).alias("out"), "segment", "ledger_id", "entry_id", "message_id", "v.*"
        )
        outputs = frame if outputs is None else outputs.unionByName(frame)
    assert outputs is not None
    leftover = spark.createDataFrame([(i,) for i in info.leftover], "id string")
    return Frames(events.cache(), inputs.cache(), outputs.cache(), leftover, run_dir, info=info)


def anomaly_frames(frames: Frames) -> dict[str, DataFrame]:
    """Each anomaly kind as the rows that show it (empty: none)."""
    events, inputs, outputs = frames.events, frames.inputs, frames.outputs
    ended = events.where(F.col("kind") == "ended")
    committed = ended.where(F.col("outcome") == "committed")
    committing = events.where(F.col("kind") == "committing").select("txn").distinct()

    aborted_read = outputs.join(
        ended.where(F.col("outcome").isin(*ABORTED)).select("txn", "outcome"), "txn"
    )
    uncommitted_read = outputs.join(committing, "txn", "left_anti")

    visible = outputs.groupBy("txn").agg(
        F.sum(F.when(F.col("out") == "a", 1).otherwise(0)).alias("in_a"),
        F.sum(F.when(F.col("out") == "b", 1).otherwise(0)).alias("in_b"),
    )
    per_txn = committed.select("txn", "client", "outputs").join(visible, "txn", "left")
    per_txn = per_txn.fillna(0, ["in_a", "in_b"])
    half = F.col("outputs") / 2
    torn = per_txn.where(
        (F.col("in_a") + F.col("in_b") > 0) & ((F.col("in_a") != half) | (F.col("in_b") != half))
    )
    # Whatever its history says (its "ended" lost with a processor killed after the
    # commit, or a commit call that failed): an input's outputs are in both topics or none.
    uneven = (
        outputs.groupBy("txn", "in_id")
        .agg(
            F.sum(F.when(F.col("out") == "a", 1).otherwise(0)).alias("a"),
            F.sum(F.when(F.col("out") == "b", 1).otherwise(0)).alias("b"),
        )
        .where(F.col("a") != F.col("b"))
        .select("txn")
        .distinct()
    )
    torn = (
        torn.select("txn", "client", "outputs", "in_a", "in_b")
        .unionByName(
            visible.join(uneven, "txn")
            .join(per_txn.select("txn", "client", "outputs"), "txn", "left")
            .select("txn", "client", "outputs", "in_a", "in_b")
        )
        .dropDuplicates(["txn"])
    )
    lost_txn = per_txn.where((F.col("in_a") + F.col("in_b") == 0) & (F.col("outputs") > 0))
    sent = events.where(F.col("kind") == "sent").select("id", "key", "seq")
    lost_input = sent.join(inputs.select("id"), "id", "left_anti")
    none = F.lit(None).cast("string")
    lost = lost_txn.select(F.lit("txn").alias("what"), "txn", none.alias("id")).unionByName(
        lost_input.select(F.lit("input").alias("what"), none.alias("txn"), "id")
    )

    duplicate = (
        outputs.groupBy("out", "in_key", "in_seq")
        .agg(
            F.count("*").alias("copies"),
            F.collect_set("txn").alias("txns"),
            F.collect_set("message_id").alias("message_ids"),
        )
        .where(F.col("copies") > 1)
    )
    with_output = outputs.select(F.col("in_id").alias("id")).distinct()
    acked_without_output = (
        inputs.join(with_output, "id", "left_anti")
        .join(frames.leftover, "id", "left_anti")
        .select("id", "key", "seq")
    )
    unacked_committed = frames.leftover.join(with_output, "id")

    in_topic_order = ["segment", "ledger_id", "entry_id"]
    by_output_key = Window.partitionBy("out", "in_key").orderBy(*in_topic_order)
    output_order = (
        outputs.withColumn("before", F.lag("in_seq").over(by_output_key))
        .withColumn("before_id", F.lag("message_id").over(by_output_key))
        .withColumn("before_txn", F.lag("txn").over(by_output_key))
        .withColumn("before_in_id", F.lag("in_id").over(by_output_key))
        .where(F.col("before") >= F.col("in_seq"))
        .select(
            F.concat(F.lit("out-"), "out").alias("topic"),
            F.col("in_key").alias("key"),
            "before",
            F.col("in_seq").alias("seq"),
            "message_id",
            "before_id",
            "txn",
            "before_txn",
            "in_id",
            "before_in_id",
        )
    )
    by_input_key = Window.partitionBy("key").orderBy(*in_topic_order)
    input_order = (
        inputs.withColumn("before", F.lag("seq").over(by_input_key))
        .withColumn("before_id", F.lag("id").over(by_input_key))
        .where(F.col("before") >= F.col("seq"))
        .select(
            F.lit("input").alias("topic"),
            "key",
            "before",
            "seq",
            F.col("id").alias("message_id"),
            "before_id",
        )
    )

    consumed = committed.select(
        "client", "session", "ts", "txn", F.posexplode("inputs").alias("pos", "input")
    )
    by_session_key = Window.partitionBy("client", "session", "input.key").orderBy("ts", "pos")
    non_monotonic = (
        consumed.withColumn("before", F.lag("input.seq").over(by_session_key))
        .where(F.col("before") >= F.col("input.seq"))
        .select("client", "session", "txn", "input.key", "before", "input.seq", "input.id")
    )
    return {
        "aborted_read": aborted_read.select(
            "txn", "outcome", "out", "in_key", "in_seq", "message_id", "in_id"
        ),
        "uncommitted_read": uncommitted_read.select(
            "txn", "out", "in_key", "in_seq", "message_id", "in_id"
        ),
        "torn_transaction": torn.select("txn", "client", "outputs", "in_a", "in_b"),
        "lost_write": lost,
        "duplicate": duplicate,
        "acked_without_output": acked_without_output,
        "unacked_committed": unacked_committed,
        "order_violation": output_order.unionByName(input_order, allowMissingColumns=True),
        "non_monotonic_read": non_monotonic,
    }


def check(frames: Frames) -> Report:
    started = time.perf_counter()
    report = Report({}, {})
    for name, frame in anomaly_frames(frames).items():
        report.counts[name] = frame.count()
        rows = [r.asDict() for r in frame.limit(SAMPLES).collect()] if report.counts[name] else []
        report.samples[name] = [
            ", ".join(f"{k}={v}" for k, v in row.items() if v is not None) for row in rows
        ]
        report.entries[name] = [sample_entries(row) for row in rows]
    wanted = sorted({e for kind in report.entries.values() for row in kind for e in row})
    if frames.run_dir is not None or frames.history is not None:
        lines = [] if frames.history is None else history_lines(frames.history, wanted)
        report.located = locate(frames.run_dir, wanted, lines)
    first_seen = entry_times(frames.events, wanted)
    report.times = {
        name: [next((first_seen[e] for e in row if e in first_seen), None) for row in rows]
        for name, rows in report.entries.items()
    }
    report.stats = run_stats(frames.events, frames.inputs, frames.outputs)
    report.stats["check_s"] = round(time.perf_counter() - started, 1)
    sent = report.stats.get("inputs_sent", 0)
    if frames.info is not None and sent != frames.info.fed:
        # An input lost with its "sent" event (a history in the cluster under test, or a
        # feeder's file gone) was counted by nothing.
        raise HistoryError(
            f"the run stored {frames.info.fed:,} inputs (run.json), its histories record "
            f"{sent:,}: the history is incomplete, and a lost input would pass unnoticed"
        )
    return report


def history_lines(history: DataFrame, entries: list[str]) -> list[tuple[str, int, str]]:
    """The events of a history topic that contain one of ``entries``, as
    (``history/<client>``, the event's place in its client's history, its text): what
    :func:`locate` searches in place of history files."""
    if not entries:
        return []
    mentions = functools.reduce(operator.or_, [F.instr("line", e) > 0 for e in entries])
    rows = history.where(mentions).orderBy("client", "n").limit(MAX_LINES).collect()
    return [(f"history/{r['client']}", r["n"], r["line"]) for r in rows]


def sample_entries(row: dict[str, Any]) -> list[str]:
    """The transaction and message ids in an anomaly's row (at most ENTRIES_PER_SAMPLE)."""
    entries: list[str] = []
    for column in ENTRY_COLUMNS:
        value = row.get(column)
        for item in value if isinstance(value, list) else [value]:
            if item is not None and str(item) not in entries:
                entries.append(str(item))
    return entries[:ENTRIES_PER_SAMPLE]
