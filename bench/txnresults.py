"""``bench/txn.py``'s results and the tables it prints (the measurements are there)."""

from __future__ import annotations

from dataclasses import dataclass, field

from common import percentile, print_rows

VISIBLE_SEGMENTS = 8
CTP_SEGMENTS = 4
IDLE_S = 0.05
"""(a) also times commits made after everything sat idle this long (a second block of
transactions per row), so that each commit starts equally cold.

Why: on a virtual machine a process woken after ~10 ms of idle answers later than one that
was just busy (a scratch echo probe between two processes here: 7 µs back to back, 0.14 ms
after 10 ms idle, 0.23 ms after 50 ms), and one END_TXN crosses many such wake-ups (client,
coordinator, its gRPC thread, etcd's goroutines). A bare etcd put from Python takes 0.7 ms
back to back and 2.0-2.7 ms after 10-50 ms idle. The sends to 64 segments keep etcd and the
coordinator idle longer than the send to one (64 fsyncs), so back to back the 64-segment
commit starts colder: that, not the number of participants, is most of its ratio."""


@dataclass
class Counts:
    """How much to do: transactions per segment count in (a) and in (b), messages per run
    in (c)."""

    end_txn: int
    visible: int
    messages: int


@dataclass
class EndTxnResult:
    segments: int
    commit: list[float]
    """Commits started as soon as the sends were durable."""
    sends: list[float]
    commit_after_idle: list[float]
    """Commits started ``IDLE_S`` after the sends were durable."""


@dataclass
class VisibleResult:
    commit: list[float]
    from_return: list[float]
    from_start: list[float]


@dataclass
class PipelineResult:
    """One consume-transform-produce run; times in seconds."""

    transactional: bool
    batch: int
    messages: int
    elapsed: float
    batches: int
    ops_phase: list[float] = field(default_factory=list)
    """Per batch: from the first send to every send and ack done (txn: after NEW_TXN)."""
    new_txn: list[float] = field(default_factory=list)
    commit: list[float] = field(default_factory=list)
    store_writes: int = 0
    """etcd write requests committed during the run (every process's)."""

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.elapsed


@dataclass
class Results:
    end_txn: list[EndTxnResult] = field(default_factory=list)
    visible: VisibleResult | None = None
    pipelines: list[PipelineResult] = field(default_factory=list)


def mean(samples: list[float]) -> float:
    return sum(samples) / len(samples) if samples else 0.0


def ms(v: float) -> str:
    return f"{v * 1000:.2f}"


def ratio(a: float, b: float) -> str:
    return "-" if b == 0 else f"{a / b:.2f}x"


def print_tables(results: Results, counts: Counts) -> None:
    print(
        f"(a) END_TXN latency: {counts.end_txn} transactions per row and kind, each one "
        "message to each of N segments (64: two 32-segment topics); the timer covers "
        f"commit() once the sends are durable, at once or after {IDLE_S * 1000:.0f} ms idle"
    )
    base = results.end_txn[0]
    rows: list[tuple[str, ...]] = [
        (
            "segments",
            "sends p50 ms",
            "sends ÷ N ms",
            "commit p50 ms",
            "commit p99 ms",
            "p50 ÷ 1 seg",
            "p99 ÷ 1 seg",
            "after idle p50",
            "p99",
            "p50 ÷ 1 seg",
            "p99 ÷ 1 seg",
        )
    ]
    for r in results.end_txn:
        p50, p99 = percentile(r.commit, 50), percentile(r.commit, 99)
        i50, i99 = percentile(r.commit_after_idle, 50), percentile(r.commit_after_idle, 99)
        rows.append(
            (
                str(r.segments),
                ms(percentile(r.sends, 50)),
                ms(percentile(r.sends, 50) / r.segments),
                ms(p50),
                ms(p99),
                ratio(p50, percentile(base.commit, 50)),
                ratio(p99, percentile(base.commit, 99)),
                ms(i50),
                ms(i99),
                ratio(i50, percentile(base.commit_after_idle, 50)),
                ratio(i99, percentile(base.commit_after_idle, 99)),
            )
        )
    print_rows(rows)
    last = results.end_txn[-1]
    for label, pick in (
        ("back to back", "commit"),
        (f"after {IDLE_S * 1000:.0f} ms idle", "commit_after_idle"),
    ):
        a, b = getattr(last, pick), getattr(base, pick)
        print(
            f"END_TXN {last.segments}/{base.segments} segments, {label}: "
            f"p50 {ratio(percentile(a, 50), percentile(b, 50))}, "
            f"p99 {ratio(percentile(a, 99), percentile(b, 99))}"
        )
    print()

    v = results.visible
    assert v is not None
    print(
        f"(b) commit-to-visible: {len(v.commit)} transactions of one message to each of "
        f"{VISIBLE_SEGMENTS} segments, one consumer subscribed before them"
    )
    rows = [("interval", "p50 ms", "p99 ms", "max ms")]
    for label, samples in (
        ("commit() call", v.commit),
        ("commit() returned -> all received", v.from_return),
        ("commit() started -> all received", v.from_start),
    ):
        rows.append(
            (label, ms(percentile(samples, 50)), ms(percentile(samples, 99)), ms(max(samples)))
        )
    print_rows(rows)
    print()

    print(
        f"(c) consume-transform-produce: {counts.messages} messages per run, "
        f"{CTP_SEGMENTS} input and {CTP_SEGMENTS} output segments, one processor loop"
    )
    rows = [
        (
            "mode",
            "batch",
            "msgs/s",
            "txn ÷ plain",
            "store writes/txn",
            "store writes/msg",
            "NEW_TXN ms",
            "sends+acks ms",
            "commit ms",
        )
    ]
    plain: dict[int, float] = {}
    for p in results.pipelines:
        if not p.transactional:
            plain[p.batch] = p.msgs_per_s
    for p in results.pipelines:
        rows.append(
            (
                "txn" if p.transactional else "plain",
                str(p.batch),
                f"{p.msgs_per_s:,.0f}",
                ratio(p.msgs_per_s, plain[p.batch]) if p.transactional else "1.00x",
                f"{p.store_writes / p.batches:.2f}",
                f"{p.store_writes / p.messages:.3f}",
                ms(mean(p.new_txn)) if p.transactional else "-",
                ms(mean(p.ops_phase)),
                ms(mean(p.commit)) if p.transactional else "-",
            )
        )
    print_rows(rows, left=2)
    print(
        "(per-batch means; store writes: etcd's committed write requests during the run, "
        "per transaction (plain: per batch) and per message)"
    )
