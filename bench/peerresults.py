"""``bench/peer.py``'s tables: per system and row (rates, latency, CPU and store writes per
message), then the ratios measured side by side in each round. Apart from the script so
that it holds the loops and the run's order, as ``brokerresults.py`` does for
``bench/broker.py``."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from common import percentile, print_rows
from peerlib import Row, Sample


@dataclass
class Plan:
    rows: list[Row]
    rounds: int
    seconds: float
    segments: int
    sub_type: str
    store: str


def ms(v: float) -> str:
    return f"{v * 1000:.1f}"


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    """``median (min-max)``, or the one value."""
    if not values:
        return "-"
    if len(values) == 1:
        return fmt.format(values[0])
    lo, mid, hi = min(values), statistics.median(values), max(values)
    return f"{fmt.format(mid)} ({fmt.format(lo)}-{fmt.format(hi)})"


def per_msg(seconds: float, messages: int) -> str:
    return f"{seconds / messages * 1e6:,.0f}" if messages else "-"


def print_tables(plan: Plan, samples: list[Sample]) -> None:
    def runs(system: str, row: Row) -> list[Sample]:
        return [s for s in samples if s.system == system and s.row == row and not s.error]

    systems = sorted({s.system for s in samples})
    print(
        f"\nper system and row, over {plan.rounds} round(s) of {plan.seconds:g} s: msg/s "
        "median (min-max); p50/p99 of per-batch latency over all rounds, and p50 of its "
        "commit call alone; CPU µs per message"
    )
    table: list[tuple[str, ...]] = [
        (
            "system",
            "row",
            "msg/s",
            "p50 ms",
            "p99 ms",
            "commit ms",
            "server",
            "other",
            "client",
            "store w/msg",
            "batches",
        )
    ]
    for system in systems:
        separate = system == "segtxn" and plan.store == "etcd"
        for row in plan.rows:
            if row.segtxn_only and system != "segtxn":
                continue  # (segtxn's own rows)
            rs = runs(system, row)
            if not rs:
                table.append((system, row.label, "failed", *["-"] * 8))
                continue
            lat = [x for s in rs for x in s.latencies]
            commits = [x for s in rs for x in s.commits]
            n = sum(s.messages for s in rs)
            table.append(
                (
                    system,
                    row.label,
                    spread([s.rate for s in rs], "{:,.0f}"),
                    ms(percentile(lat, 50)),
                    ms(percentile(lat, 99)),
                    ms(percentile(commits, 50)) if commits else "-",
                    per_msg(sum(s.server_cpu for s in rs), n),
                    per_msg(sum(s.other_cpu for s in rs), n) if separate else "-",
                    per_msg(sum(s.client_cpu for s in rs), n),
                    f"{sum(s.store_writes for s in rs) / n:.3f}" if separate and n else "-",
                    str(len(lat)),
                )
            )
    print_rows(table, left=2)
    print(
        "(server: segtxn broker / RabbitMQ node; other: segtxn coordinator + etcd; client: "
        "this process; store w/msg: etcd's committed raft proposals per message, every "
        "write request of every segtxn process)"
    )

    plain = [row for row in plan.rows if not row.transactional]

    def ratio(a: list[Sample], b: list[Sample]) -> list[float]:
        """Per round in which both ran."""
        base = {y.round: y.rate for y in b if y.rate}
        return [x.rate / base[x.round] for x in a if x.round in base]

    def vs_plain(system: str, row: Row) -> str:
        if not row.transactional or not plain:
            return "-"
        base = min(plain, key=lambda p: (abs(math.log(p.size / row.size)), p.size))
        return f"{spread(ratio(runs(system, row), runs(system, base)))} [÷ plain {base.size}]"

    print("\nratios, per round side by side: median (min-max)")
    header: tuple[str, ...] = ("row",)
    if len(systems) > 1:
        header += ("segtxn ÷ RabbitMQ",)
    table = [header + tuple(f"txn ÷ plain, {s}" for s in systems)]
    for row in plan.rows:
        cells: tuple[str, ...] = (row.label,)
        if len(systems) > 1:  # (segtxn's own rows against RabbitMQ's txn row of their size)
            peer = Row(True, row.size) if row.segtxn_only else row
            cells += (spread(ratio(runs("segtxn", row), runs("RabbitMQ", peer))),)
        table.append(cells + tuple(vs_plain(s, row) for s in systems))
    print_rows(table)
    for s in samples:
        if s.error:
            print(f"FAILED: round {s.round + 1}, {s.row.label}, {s.system}: {s.error}")
