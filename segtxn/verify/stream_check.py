"""The continuous check: a Spark streaming query over a run's three topics that reports, per
micro-batch, the anomalies it can decide while the workload runs.

Decided online (the batch checker, :mod:`.checker`, decides every kind at the end):

``order_violation``
    a key's records out of order in a topic (input, out-a, out-b): per key, each record's
    ``seq`` must be above the last one's. The stream delivers a key's records in the topic's
    order across splits and merges (:mod:`.offsets`), so one number per key and topic holds
    the state.
``duplicate``
    one input's output twice in an output topic. Only within the window: each key keeps
    the ``window`` highest ``in_seq`` it saw; an older copy shows up as an order violation.
``aborted_read``
    a visible output whose transaction the processor's history records as aborted or timed
    out. An output can be visible before its ``ended`` line is written: it then waits (in
    ``pending``, at most ``max_pending`` transactions, the oldest given up as ``undecided``)
    until the histories say. Histories in files are read as the processes append them
    (:class:`Outcomes`); a history topic is a fourth stream of the query (:func:`run_frame`
    with ``history``), its ``ended`` events handed to the check with the records.

State is this process's memory (the query's checkpoint keeps the offsets, not it): a check
restarted from its checkpoint reads on where it stopped, without the keys' last records.
"""

from __future__ import annotations

import functools
import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from segtxn.verify.checker import ABORTED, INPUT_VALUE, OUTPUT_VALUE
from segtxn.verify.processor import Topics

ONLINE: dict[str, str] = {
    "aborted_read": "an output of an aborted transaction is visible (G1a)",
    "duplicate": "one input produced more than one visible output in a topic (within the window)",
    "order_violation": "a key's records are out of order in a topic",
}
SAMPLES = 5
COLUMNS = "segment,ledger_id,entry_id,message_id,value"
"""What the check reads of each message (no key, publish time: the value has the key)."""


@dataclass(frozen=True)
class Record:
    """One message of the run as the check sees it: ``topic`` is ``input``, ``out-a`` or
    ``out-b``; for an output, ``key``/``seq`` are its input's and ``txn`` its transaction.
    ``topic`` :data:`HISTORY`: an ``ended`` event of the history topic, ``txn`` ended with
    ``outcome`` (``key``: its client)."""

    topic: str
    key: str
    seq: int
    message_id: str
    txn: str | None = None
    outcome: str | None = None


HISTORY = "history"


@dataclass
class BatchReport:
    """One micro-batch: its rows, the anomalies found in it (by kind), the transactions
    still waiting for their outcome."""

    batch_id: int
    rows: int
    found: dict[str, int]
    pending: int

    def line(self) -> str:
        kinds = " ".join(f"{k}={v}" for k, v in self.found.items())
        return f"batch {self.batch_id}: {self.rows} records; {kinds}; pending txns {self.pending}"


class Outcomes:
    """Transaction outcomes from the run's history files (``ended`` lines), read as the
    processes append them: :meth:`poll` reads what was added, a line being written waits.
    ``directory`` None: the histories are in a topic, whose ``ended`` events come with the
    stream's records (:meth:`OnlineCheck.batch` adds them)."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self.outcomes: dict[str, str] = {}
        self._offsets: dict[Path, int] = {}

    def poll(self) -> None:
        if self.directory is None:
            return
        for path in sorted(self.directory.glob("*.jsonl")):
            with open(path, "rb") as f:
                f.seek(self._offsets.get(path, 0))
                data = f.read()
            complete = data[: data.rfind(b"\n") + 1]
            self._offsets[path] = self._offsets.get(path, 0) + len(complete)
            for line in complete.splitlines():
                try:
                    event = msgspec.json.decode(line)
                except msgspec.DecodeError:
                    continue  # torn by a SIGKILL
                if event.get("kind") == "ended" and event.get("txn"):
                    self.outcomes[str(event["txn"])] = str(event.get("outcome"))


@dataclass
class OnlineCheck:
    """The check's state across micro-batches; :meth:`batch` takes one batch's records in
    the topics' order."""

    outcomes: Outcomes
    window: int = 1000
    max_pending: int = 100_000
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ONLINE, 0))
    samples: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in ONLINE})
    undecided: int = 0
    last_batch: int = -1
    """The last micro-batch checked: Spark runs a batch again, with the same records, when
    its query stopped before committing it; the check skips it then."""
    _last: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)
    _recent: dict[tuple[str, str], tuple[list[int], set[int]]] = field(default_factory=dict)
    _pending: OrderedDict[str, list[Record]] = field(default_factory=OrderedDict)

    @property
    def anomalies(self) -> int:
        return sum(self.counts.values())

    @property
    def pending(self) -> int:
        """Transactions with visible outputs whose outcome no history has given yet."""
        return len(self._pending)

    def batch(self, batch_id: int, records: Iterable[Record]) -> BatchReport:
        if batch_id <= self.last_batch:  # checked already: the same records again
            return BatchReport(batch_id, 0, dict.fromkeys(ONLINE, 0), self.pending)
        self.last_batch = batch_id
        before = dict(self.counts)
        self.outcomes.poll()
        n = 0
        for record in records:
            if record.topic == HISTORY:
                if record.txn is not None and record.outcome is not None:
                    self.outcomes.outcomes[record.txn] = record.outcome
                continue
            n += 1
            self._order(record)
            if record.txn is not None:
                self._duplicate(record)
                self._pending.setdefault(record.txn, []).append(record)
        for txn in list(self._pending):
            outcome = self.outcomes.outcomes.get(txn)
            if outcome is None:
                continue
            for record in self._pending.pop(txn):
                if outcome in ABORTED:
                    self._found("aborted_read", f"txn={txn}, outcome={outcome}, {_show(record)}")
        while len(self._pending) > self.max_pending:
            self._pending.popitem(last=False)
            self.undecided += 1
        found = {k: self.counts[k] - before[k] for k in ONLINE}
        return BatchReport(batch_id, n, found, self.pending)

    def _order(self, record: Record) -> None:
        key = record.topic, record.key
        last = self._last.get(key)
        if last is not None and last[0] >= record.seq:
            self._found(
                "order_violation",
                f"before={last[0]}, before_id={last[1]}, {_show(record)}",
            )
        if last is None or record.seq > last[0]:
            self._last[key] = record.seq, record.message_id

    def _duplicate(self, record: Record) -> None:
        heap, seen = self._recent.setdefault((record.topic, record.key), ([], set()))
        if record.seq in seen:
            self._found("duplicate", _show(record))
            return
        heapq.heappush(heap, record.seq)
        seen.add(record.seq)
        if len(heap) > self.window:
            seen.discard(heapq.heappop(heap))

    def _found(self, kind: str, sample: str) -> None:
        self.counts[kind] += 1
        if len(self.samples[kind]) < SAMPLES:
            self.samples[kind].append(sample)


def _show(record: Record) -> str:
    txn = f", txn={record.txn}" if record.txn else ""
    return f"topic={record.topic}, key={record.key}, seq={record.seq}{txn}, id={record.message_id}"


def records(frame: DataFrame) -> list[Record]:
    """A micro-batch's rows (:func:`run_frame`) as records, in each topic's order."""
    rows = frame.orderBy("topic", "segment", "ledger_id", "entry_id").collect()
    return [
        Record(r["topic"], r["key"], r["seq"], r["message_id"], r["txn"], r["outcome"])
        for r in rows
    ]


def run_frame(
    spark: SparkSession, url: str, topics: Topics, *, history: bool = False, **options: str
) -> DataFrame:
    """The run's three topics as one stream: ``topic`` (input, out-a, out-b), ``segment``,
    ``ledger_id``, ``entry_id``, ``message_id``, ``key``, ``seq``, ``txn``, ``outcome``;
    with ``history``, the ``ended`` events of its history topic too (``topic`` history)."""
    labels = [("input", topics.input), ("out-a", topics.out_a), ("out-b", topics.out_b)]
    if history:
        labels.append((HISTORY, topics.history))
    frames: list[DataFrame] = []
    for label, topic in labels:
        reader = spark.readStream.format("segtxn").option("url", url).option("topic", topic)
        for name, value in {"columns": COLUMNS, **options}.items():
            reader = reader.option(name, value)
        stream = reader.load()
        text = F.col("value").cast("string")
        outcome = F.lit(None).cast("string")
        if label == "input":
            v = F.from_json(text, INPUT_VALUE)
            key, seq, txn = v["key"], v["seq"], F.lit(None).cast("string")
        elif label == HISTORY:
            stream = stream.where(F.get_json_object(text, "$.kind") == "ended")
            key, seq = F.get_json_object(text, "$.client"), F.lit(0).cast("long")
            txn, outcome = F.get_json_object(text, "$.txn"), F.get_json_object(text, "$.outcome")
        else:
            v = F.from_json(text, OUTPUT_VALUE)
            key, seq, txn = v["in_key"], v["in_seq"], v["txn"]
        frames.append(
            stream.select(
                F.lit(label).alias("topic"),
                "segment",
                "ledger_id",
                "entry_id",
                "message_id",
                key.alias("key"),
                seq.alias("seq"),
                txn.alias("txn"),
                outcome.alias("outcome"),
            )
        )
    return functools.reduce(DataFrame.unionByName, frames)


def start_check(
    frame: DataFrame,
    check: OnlineCheck,
    checkpoint: Path,
    report: Callable[[BatchReport], Any],
    *,
    trigger_s: float | None = 1.0,
) -> StreamingQuery:
    """Run ``check`` on each micro-batch of ``frame`` (:func:`run_frame`), handing each
    batch's report to ``report``; ``trigger_s`` None: read what the topics hold now, then
    stop (Trigger.AvailableNow)."""

    def each(batch: DataFrame, batch_id: int) -> None:
        report(check.batch(batch_id, records(batch)))

    writer = frame.writeStream.foreachBatch(each).option("checkpointLocation", str(checkpoint))
    if trigger_s is None:
        return writer.trigger(availableNow=True).start()
    return writer.trigger(processingTime=f"{int(trigger_s * 1000)} milliseconds").start()
