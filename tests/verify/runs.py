"""A recorded run, built in memory: the clean run the checker's and the report's tests start
from (and inject anomalies into), as frames or as the files a run leaves."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from segtxn.verify.checker import EVENT_SCHEMA, Frames

INPUTS = "segment int, ledger_id long, entry_id long, id string, key string, seq long"
OUTPUTS = (
    "out string, segment int, ledger_id long, entry_id long, message_id string, "
    "in_key string, in_seq long, in_id string, txn string, client string"
)
EVENT_FIELDS = [part.split()[0] for part in EVENT_SCHEMA.split(", ") if " " in part]


def event(kind: str, **fields: Any) -> dict[str, Any]:
    row = dict.fromkeys(EVENT_FIELDS)
    ts = float(fields.pop("ts", 0.0))
    row.update(kind=kind, client=fields.pop("client", "p1"), session="s1", ts=ts)
    row.update(fields)
    return row


def txn(name: str, ts: float, outcome: str, inputs: list[tuple[str, int]]) -> list[dict[str, Any]]:
    consumed = [{"key": k, "seq": s, "id": input_id(k, s)} for k, s in inputs]
    events = [event("begin", txn=name, ts=ts)]
    events += [event("received", ts=ts, **c) for c in consumed]
    if outcome != "aborted":
        events.append(event("committing", txn=name, ts=ts + 0.1))
    events.append(
        event(
            "ended",
            txn=name,
            ts=ts + 0.2,
            outcome=outcome,
            inputs=consumed,
            outputs=2 * len(inputs),
            commit_ms=1.0,
        )
    )
    return events


def input_id(key: str, seq: int) -> str:
    return f"segment://t/in/0@1:{KEYS.index(key) * 10 + seq}"


KEYS = ["k0", "k1", "k2"]
INPUT_IDS = {input_id(k, s) for k in KEYS for s in range(3)}


@dataclass
class Run:
    """A clean run: inputs k0:0, k0:1, k1:0; T1 commits k0:0 and k0:1; T2 aborts k1:0, then
    T3 commits it. Every committed input has one output in each of out-a and out-b."""

    events: list[dict[str, Any]] = field(default_factory=list)
    inputs: list[tuple[Any, ...]] = field(default_factory=list)
    outputs: list[tuple[Any, ...]] = field(default_factory=list)
    leftover: list[str] = field(default_factory=list)

    @classmethod
    def clean(cls) -> Run:
        run = cls()
        for key, seq in [("k0", 0), ("k0", 1), ("k1", 0)]:
            run.events.append(
                event("sent", client="feeder", key=key, seq=seq, id=input_id(key, seq))
            )
            entry = KEYS.index(key) * 10 + seq
            run.inputs.append((0, 1, entry, input_id(key, seq), key, seq))
        run.events += txn("T1", 1.0, "committed", [("k0", 0), ("k0", 1)])
        run.events += txn("T2", 2.0, "aborted", [("k1", 0)])
        run.events += txn("T3", 3.0, "committed", [("k1", 0)])
        for out in ("a", "b"):
            for entry, (key, seq, name) in enumerate(
                [("k0", 0, "T1"), ("k0", 1, "T1"), ("k1", 0, "T3")]
            ):
                run.output(out, entry, key, seq, name)
        return run

    def output(self, out: str, entry: int, key: str, seq: int, name: str) -> None:
        self.outputs.append(
            (out, 0, 1, entry, f"segment://t/out-{out}/0@1:{entry}", key, seq,
             input_id(key, seq), name, "p1")
        )  # fmt: skip

    def frames(self, spark: SparkSession, run_dir: Path | None = None) -> Frames:
        return Frames(
            events=spark.createDataFrame(self.events, EVENT_SCHEMA),
            inputs=spark.createDataFrame(self.inputs, INPUTS),
            outputs=spark.createDataFrame(self.outputs, OUTPUTS),
            leftover=spark.createDataFrame([(i,) for i in self.leftover], "id string"),
            run_dir=run_dir,
        )

    def write(self, run_dir: Path, log: list[str]) -> dict[str, list[dict[str, Any]]]:
        """The run's files, as a run leaves them: one history per client (JSON lines, as
        History writes them) and ``logs/standalone.log``; returns each client's lines."""
        histories: dict[str, list[dict[str, Any]]] = {}
        for e in self.events:
            histories.setdefault(e["client"], []).append(
                {k: v for k, v in e.items() if v is not None}
            )
        (run_dir / "history").mkdir(parents=True)
        for client, lines in histories.items():
            text = "".join(json.dumps(line) + "\n" for line in lines)
            (run_dir / "history" / f"{client}.jsonl").write_text(text)
        (run_dir / "logs").mkdir()
        (run_dir / "logs" / "standalone.log").write_text("".join(f"{line}\n" for line in log))
        return histories
