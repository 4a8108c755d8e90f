"""The checker's self-test: a clean recorded run passes, and each anomaly kind injected into
it is caught. A checker that cannot fail proves nothing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from pyspark.sql import SparkSession

from segtxn.verify.checker import ANOMALIES, EVENT_SCHEMA, Frames, anomaly_frames, check

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

    def frames(self, spark: SparkSession) -> Frames:
        return Frames(
            events=spark.createDataFrame(self.events, EVENT_SCHEMA),
            inputs=spark.createDataFrame(self.inputs, INPUTS),
            outputs=spark.createDataFrame(self.outputs, OUTPUTS),
            leftover=spark.createDataFrame([(i,) for i in self.leftover], "id string"),
        )


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
