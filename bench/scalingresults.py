"""``bench/scaling.py``'s results and the tables it prints (the measurements are there).

It is a module of its own so that what is measured and how it is reported can be read and
changed apart, as ``txnresults.py`` does for ``bench/txn.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from common import percentile, print_rows

# The load's shape: ``scaling.py`` produces with it and the tables say what it was.
KEYS = 1000
PAYLOAD_BYTES = 100
IN_FLIGHT = 500
AFTER_SPLIT_S = 0.5


@dataclass
class Phase:
    name: str
    segments: int
    start: float
    end: float
    sent: int = 0
    latencies: list[float] = field(default_factory=list)

    @property
    def msgs_per_s(self) -> float:
        return self.sent / (self.end - self.start)


@dataclass
class Split:
    segment: int
    children: list[int]
    start: float
    returned: float
    end: float
    reroutes: int
    baseline_p99: float
    latencies: list[float] = field(default_factory=list)

    @property
    def duration(self) -> float:
        return self.returned - self.start


@dataclass
class Verification:
    expected: int
    received: int = 0
    distinct: int = 0
    duplicates: int = 0
    missing: int = 0
    unexpected: int = 0
    out_of_order: int = 0
    redelivered: int = 0
    elapsed: float = 0.0
    timed_out: bool = False
    across_segments: int = 0
    """Of ``out_of_order``: the two messages are in different segments."""
    stored_out_of_order: int = 0
    """Sends of one key stored in one segment in another order than they were sent."""
    examples: list[str] = field(default_factory=list)
    ack_errors: dict[str, int] = field(default_factory=dict)
    """Failed acknowledgments, by error."""


@dataclass
class Results:
    phases: list[Phase] = field(default_factory=list)
    splits: list[Split] = field(default_factory=list)
    placement: list[tuple[int, int, int, str]] = field(default_factory=list)
    """(segment id, lo, hi, broker id) of the active segments at the end."""
    acked: int = 0
    errors: list[str] = field(default_factory=list)
    reroutes: int = 0
    verification: Verification | None = None


# ---------------------------------------------------------------------- output


def ms(v: float) -> str:
    return f"{v * 1000:.1f}"


def ratio(a: float, b: float) -> str:
    return "-" if b == 0 or math.isnan(b) else f"{a / b:.2f}x"


def passed(results: Results) -> bool:
    """The run's verdict, printed and the script's exit status alike: every acknowledged
    send read back once, in order per key, and no send or acknowledgment failed."""
    v = results.verification
    return v is not None and not (
        v.missing
        or v.duplicates
        or v.unexpected
        or v.out_of_order
        or v.stored_out_of_order
        or v.timed_out
        or v.ack_errors
        or results.errors
    )


def print_tables(results: Results, seconds: float) -> None:
    print(
        f"producer throughput: one ScalableProducer, {IN_FLIGHT} sends in flight, "
        f"{PAYLOAD_BYTES}-byte payloads, {KEYS} keys; {seconds:g} s per steady phase"
    )
    base = results.phases[0].msgs_per_s
    rows: list[tuple[str, ...]] = [
        ("phase", "active segments", "msgs/s", "÷ 1 segment", "p50 ms", "p99 ms", "max ms")
    ]
    for p in results.phases:
        rows.append(
            (
                p.name,
                str(p.segments),
                f"{p.msgs_per_s:,.0f}",
                ratio(p.msgs_per_s, base),
                ms(percentile(p.latencies, 50)),
                ms(percentile(p.latencies, 99)),
                ms(max(p.latencies, default=0.0)),
            )
        )
    print_rows(rows, left=1)
    print()
    print(
        f"the pause at each split: sends in flight from the split call until {AFTER_SPLIT_S:g} s "
        "after it returned, against the p99 of the steady phase before it"
    )
    rows = [
        (
            "split",
            "segments",
            "split ms",
            "sends",
            "p99 ms",
            "max ms",
            "p99 ÷ steady p99",
            "max ÷ steady p99",
            "reroutes",
        )
    ]
    active = 1
    for s in results.splits:
        rows.append(
            (
                f"{s.segment} -> {', '.join(map(str, s.children))}",
                f"{active} -> {active + 1}",
                ms(s.duration),
                f"{len(s.latencies):,}",
                ms(percentile(s.latencies, 99)),
                ms(max(s.latencies, default=0.0)),
                ratio(percentile(s.latencies, 99), s.baseline_p99),
                ratio(max(s.latencies, default=0.0), s.baseline_p99),
                str(s.reroutes),
            )
        )
        active += 1
    print_rows(rows, left=2)
    print()
    spread = ", ".join(
        f"segment {i} [{lo:#06x}-{hi:#06x}] on {broker}" for i, lo, hi, broker in results.placement
    )
    per_broker: dict[str, int] = {}
    for *_, broker in results.placement:
        per_broker[broker] = per_broker.get(broker, 0) + 1
    print(f"placement of the active segments: {spread}")
    print(
        "segments per broker: "
        + ", ".join(f"{b} {n}" for b, n in sorted(per_broker.items()))
        + ("" if len(per_broker) > 1 else "  <- all on one broker")
    )
    print(f"sends re-routed in all: {results.reroutes}; failed sends: {len(results.errors)}")
    for error in results.errors[:5]:
        print(f"  {error}")
    v = results.verification
    assert v is not None
    ok = passed(results)
    print(
        f"verification ({v.elapsed:.1f} s): {v.expected:,} sends acknowledged, {v.received:,} "
        f"messages received, {v.distinct:,} distinct; missing {v.missing}, duplicates "
        f"{v.duplicates}, unknown {v.unexpected}, received out of order per key "
        f"{v.out_of_order} ({v.across_segments} across segments; stored out of order per key "
        f"and segment {v.stored_out_of_order}), "
        f"redelivered {v.redelivered}{', consumer idle timeout' if v.timed_out else ''} "
        f"=> {'OK' if ok else 'FAILED'}"
    )
    for example in v.examples:
        print(f"  {example}")
    for error, count in v.ack_errors.items():
        print(f"  {count} acknowledgments failed with {error}")
    if any("ClientClosed" in error for error in v.ack_errors):
        print(
            "  (the consumer closes a parent segment's stream on end_of_topic; the broker sends "
            "end_of_topic once its in-memory cursor covers the ledger, before the last acks "
            "are durable and confirmed, so those acks fail on the client)"
        )
