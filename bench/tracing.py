"""Tracing benchmark: what tracing costs a send, off and on, next to the code without it.

Each measurement runs in a **child process** (this script started again with ``--child
MODE``) holding a whole cluster and its client: a broker and a v5 coordinator on the
embedded ``memory://`` store with ``memory://`` ledgers (no disk: the send path's CPU is
the subject), and a :class:`~segtxn.client.Client` on loopback. The cost of a send is the
child's CPU time (``time.process_time``: client and servers, every thread) over the sends
made, for two workloads:

1. **plain**: ``--sends`` 100 B messages with ``send_async``, 1000 in flight, on one
   ``persistent://`` topic;
2. **transactional**: the same number in transactions of 100 sends each on a one-segment
   ``topic://`` (NEW_TXN, the sends, END_TXN(COMMIT) each).

Modes:

- ``before``: the package at ``--baseline DIR`` (a tree without tracing, e.g.
  ``git archive <commit> | tar -x -C DIR``): the cost tracing must not add to when off;
- ``off``: this tree, no ``OTEL_*`` variables (the default);
- ``on``: this tree, tracing on with the SDK's ``TracerProvider`` (always sampled) and a
  ``BatchSpanProcessor`` into an exporter that drops the spans: every span is made,
  ended and handed over, nothing is written (an exporter's I/O runs in its own thread and
  depends on where it sends);
- ``on-1%``: the same with ``OTEL_TRACES_SAMPLER=parentbased_traceidratio`` at 0.01, as a
  busy production system would run: the other 99 % of spans are non-recording.

Modes alternate for ``--rounds`` rounds (so a slow spell of a shared machine hits all of
them); each row is the median over rounds, with the ratio to ``before`` (or ``off``).
The cores are shared by the client and the servers, so read the ratios, not the figures.

Run: ``.venv/bin/python bench/tracing.py [--baseline DIR] [--sends N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
TXN_SIZE = 100


async def _cluster_and_sends(mode: str, sends: int) -> dict[str, float]:
    from segtxn.broker.app import BrokerServer
    from segtxn.broker.settings import BrokerSettings
    from segtxn.client import Client
    from segtxn.coordinator.app import CoordinatorServer
    from segtxn.coordinator.settings import CoordinatorSettings
    from segtxn.metastore.etcd_server import free_port

    if mode.startswith("on"):
        _trace_into_nothing(0.01 if mode == "on-1%" else 1.0)
    port, txn_port = free_port(), free_port()
    broker = BrokerServer(
        BrokerSettings(
            broker_id="bench",
            advertise_url=f"http://127.0.0.1:{port}",
            store_url="memory://",
            ledger_url="memory://",
        ),
        host="127.0.0.1",
        port=port,
    )
    coordinator = CoordinatorServer(
        CoordinatorSettings(advertise_url=f"http://127.0.0.1:{txn_port}", store_url="memory://"),
        host="127.0.0.1",
        port=txn_port,
        store=broker.service.store,
    )
    await broker.start()
    await coordinator.start()
    try:
        async with asyncio.timeout(30):
            await coordinator.coordinator.ready.wait()
        async with Client(broker.settings.advertise_url) as client:
            return {
                "plain": await _plain(client, sends),
                "transactional": await _transactional(client, sends),
            }
    finally:
        await coordinator.stop()
        await broker.stop()


def _trace_into_nothing(ratio: float) -> None:
    from collections.abc import Sequence

    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    from segtxn import tracing

    class Dropped(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    tracing.enable(provider)


async def _plain(client: Any, sends: int) -> float:
    """CPU µs per plain send (after a warm-up of a tenth as many)."""
    topic = "persistent://bench/tracing/plain"
    await client.admin.create_topic(topic)
    producer = await client.create_producer(topic, max_pending=1000)
    payload = b"x" * 100

    async def run(n: int) -> float:
        started = time.process_time()
        futures = [await producer.send_async(payload) for _ in range(n)]
        await asyncio.gather(*futures)
        return (time.process_time() - started) / n * 1e6

    await run(sends // 10)
    return await run(sends)


async def _transactional(client: Any, sends: int) -> float:
    """CPU µs per send in transactions of :data:`TXN_SIZE` (their NEW_TXN and END_TXN
    included)."""
    topic = "topic://bench/tracing/txn"
    await client.admin.create_topic(topic, segments=1)
    producer = await client.create_producer(topic)
    payload = b"x" * 100

    async def run(n: int) -> float:
        started = time.process_time()
        for _ in range(max(1, n // TXN_SIZE)):
            async with client.transaction() as txn:
                futures = [
                    await producer.send_async(payload, key="k", txn=txn) for _ in range(TXN_SIZE)
                ]
                await asyncio.gather(*futures)
        return (time.process_time() - started) / (max(1, n // TXN_SIZE) * TXN_SIZE) * 1e6

    await run(sends // 10)
    return await run(sends)


def _child(mode: str, tree: Path, sends: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(tree)
    done = subprocess.run(
        [sys.executable, __file__, "--child", mode, "--sends", str(sends)],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{mode}: exit {done.returncode}: {done.stderr[-2000:]}")
    result: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="a tree without tracing (the 'before' row)")
    parser.add_argument("--sends", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(_cluster_and_sends(args.child, args.sends))))
        return
    modes = [("before", args.baseline)] if args.baseline else []
    modes += [("off", HERE), ("on", HERE), ("on-1%", HERE)]
    samples: dict[str, list[dict[str, float]]] = {mode: [] for mode, _ in modes}
    for round_ in range(args.rounds):
        for mode, tree in modes:
            samples[mode].append(_child(mode, tree, args.sends))
        print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
    reference = modes[0][0]
    print(f"CPU µs per send (client and servers), median of {args.rounds} rounds, "
          f"{args.sends} sends each; ratio to '{reference}'")  # fmt: skip
    print(f"{'mode':8} {'plain':>10} {'ratio':>7} {'txn':>10} {'ratio':>7}")
    for mode, _ in modes:
        row = [mode.ljust(8)]
        for workload in ("plain", "transactional"):
            value = statistics.median(s[workload] for s in samples[mode])
            base = statistics.median(s[workload] for s in samples[reference])
            row += [f"{value:10.1f}", f"{value / base:7.3f}"]
        print(" ".join(row))


if __name__ == "__main__":
    main()
