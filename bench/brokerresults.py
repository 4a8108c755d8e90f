"""``bench/broker.py``'s results and the tables it prints (the measurements are in
``brokerload.py``).

It is a module of its own so that what is measured and how it is reported can be read and
changed apart, as ``txnresults.py`` does for ``bench/txn.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from common import print_rows

# The load's shape: ``brokerload.py`` runs it and the tables say what it was.
SIZE = 100
"""Payload bytes of every message and raw ledger entry."""
MAX_PENDING = 1000
"""Messages in flight per producer (and raw ``append`` tasks per ledger), saturated."""
PACED_RATE = 1000.0


@dataclass
class RawResult:
    """Raw ledger appends: ``ledgers`` ledgers with ``appenders`` tasks each."""

    ledgers: int
    appenders: int
    appends: int
    elapsed: float
    entries: int
    batches: int

    @property
    def appends_per_s(self) -> float:
        return self.appends / self.elapsed

    @property
    def mb_per_s(self) -> float:
        return self.appends_per_s * SIZE / 1e6

    @property
    def avg_batch(self) -> float:
        return self.entries / self.batches if self.batches else 0.0


@dataclass
class ProduceResult:
    """One saturated run: messages made durable in the window; latencies in seconds."""

    producers: int
    batching: bool
    messages: int
    elapsed: float
    server_cpu: float = 0.0
    """CPU seconds of the broker process in the window."""
    client_cpu: float = 0.0
    """CPU seconds of the client's process (this one) in the window."""
    entries: int = 0
    batches: int = 0
    p50: float | None = None
    p99: float | None = None
    samples: int = 0
    missing: int = 0

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.elapsed

    @property
    def mb_per_s(self) -> float:
        return self.msgs_per_s * SIZE / 1e6

    @property
    def avg_batch(self) -> float:
        return self.entries / self.batches if self.batches else 0.0


@dataclass
class PacedResult:
    """One paced run: latencies in seconds."""

    batching: bool
    messages: int
    elapsed: float
    durable_p50: float
    durable_p99: float
    e2e_p50: float
    e2e_p99: float
    samples: int
    missing: int

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.elapsed


# ---------------------------------------------------------------------- output


def per_msg_us(cpu_s: float, messages: int) -> str:
    return f"{cpu_s / messages * 1e6:.0f}" if messages else "-"


def fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.2f}"


def print_tables(
    raw: dict[int, RawResult],
    saturated_rows: list[tuple[ProduceResult, ProduceResult]],
    paced_rows: list[PacedResult],
) -> None:
    rows: list[tuple[str, ...]] = [
        (
            "config",
            "msgs/s",
            "MB/s",
            "avg batch",
            "÷ raw",
            "+consumer msgs/s",
            "e2e p50 ms",
            "e2e p99 ms",
            "CPU µs/msg broker / client",
        )
    ]
    for r in raw.values():
        label = f"raw ledger, {r.ledgers} ledger{'s' if r.ledgers > 1 else ''} x {r.appenders}"
        rows.append(
            (
                label,
                f"{r.appends_per_s:,.0f}",
                f"{r.mb_per_s:,.2f}",
                f"{r.avg_batch:.1f}",
                "1.00x",
                "-",
                "-",
                "-",
                "-",
            )
        )
    notes: list[str] = []
    for alone, consumed in saturated_rows:
        label = (
            f"broker, {alone.producers} producer{'s' if alone.producers > 1 else ''}, "
            f"batching {'on' if alone.batching else 'off'}"
        )
        if consumed.missing:
            notes.append(f"{label}: {consumed.missing} messages never reached the consumer")
        rows.append(
            (
                label,
                f"{alone.msgs_per_s:,.0f}",
                f"{alone.mb_per_s:,.2f}",
                f"{alone.avg_batch:.1f}",
                f"{alone.msgs_per_s / raw[alone.producers].appends_per_s:.2f}x",
                f"{consumed.msgs_per_s:,.0f}",
                fmt_ms(consumed.p50),
                fmt_ms(consumed.p99),
                f"{per_msg_us(alone.server_cpu, alone.messages)} / "
                f"{per_msg_us(alone.client_cpu, alone.messages)}",
            )
        )
    print_rows(rows)
    print(
        f"(÷ raw: broker msgs/s over raw ledger appends/s with as many ledgers, 100 B, same "
        f"directory; +consumer: the same load on fresh topics with one consumer each, whose "
        f"publish-to-receive latency is e2e; {MAX_PENDING} in flight per producer; CPU: user + "
        f"system seconds of the broker process and of the client's, in the window without "
        f"a consumer, per message stored)"
    )
    print()
    paced_table: list[tuple[str, ...]] = [
        (
            "paced, 1 producer",
            "target msgs/s",
            "msgs/s",
            "durable p50 ms",
            "durable p99 ms",
            "e2e p50 ms",
            "e2e p99 ms",
        )
    ]
    for p in paced_rows:
        label = f"batching {'on' if p.batching else 'off'}"
        if p.missing:
            notes.append(f"paced, {label}: {p.missing} messages never reached the consumer")
        paced_table.append(
            (
                label,
                f"{PACED_RATE:,.0f}",
                f"{p.msgs_per_s:,.0f}",
                fmt_ms(p.durable_p50),
                fmt_ms(p.durable_p99),
                fmt_ms(p.e2e_p50),
                fmt_ms(p.e2e_p99),
            )
        )
    print_rows(paced_table)
    print("(durable: send_async to receipt; e2e: send_async to receive, same process)")
    for note in notes:
        print(f"WARNING: {note}")
