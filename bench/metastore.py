"""Metadata-store micro-benchmark: the ``memory://`` backend next to a private etcd.

For each backend it measures, through the public :class:`~segtxn.metastore.MetadataStore`
API (so the store's own planning, caching and index maintenance are included):

1. **sequential CAS puts/s**: one writer, one key, each put a compare-and-set against the
   version the previous put returned;
2. **64-in-flight puts/s**: 64 concurrent tasks, each writing fresh keys unconditionally;
3. **indexed puts/s**: as (2), but every put also maintains two secondary-index entries;
4. **sequential-key puts/s**: 64 concurrent tasks doing ``sequential=True`` puts under 8
   prefixes (the store serialises puts under one prefix within a client);
5. **watch latency p50/p99**: one watcher on a prefix and one writer doing one put at a
   time; a sample is the time from just before ``put()`` to the event's arrival in the
   watcher task.

The etcd backend is a single-member server this script starts (data on ``/dev/shm`` when
it exists, fsync on) and stops itself. Each throughput figure comes from a time-bounded
loop (``--seconds``); the watch latency from a count-bounded one (also capped by
``--seconds``). The numbers depend on the machine, so read them as side-by-side ratios from
one run, not as absolute figures.

Run: ``.venv/bin/python bench/metastore.py [--seconds S] [--only memory|etcd]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from common import percentile

from segtxn.metastore import MUST_NOT_EXIST, EventKind, MetadataStore, open_store
from segtxn.metastore.etcd_server import EtcdServer, find_etcd_binary

CONCURRENCY = 64
SEQ_PREFIXES = 8
VALUE = b"v" * 100
WATCH_SAMPLES = {"memory": 5000, "etcd": 500}

PutFn = Callable[[int, int], Awaitable[object]]


@dataclass
class Result:
    """One backend's figures: throughputs in ops/s, latencies in seconds."""

    backend: str
    throughput: dict[str, float] = field(default_factory=dict)
    latency: dict[str, float] = field(default_factory=dict)
    watch_samples: int = 0


async def cas_puts(store: MetadataStore, seconds: float) -> float:
    """One writer, one key, each put a CAS against the previous version."""
    key = "/bench/cas/key"
    record = await store.put(key, VALUE, expected_version=MUST_NOT_EXIST)
    n = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        record = await store.put(key, VALUE, expected_version=record.version)
        n += 1
    return n / (time.perf_counter() - start)


async def in_flight(seconds: float, put: PutFn) -> float:
    """Run ``CONCURRENCY`` workers calling ``put(worker, i)`` until the deadline."""
    counts = [0] * CONCURRENCY
    start = time.perf_counter()
    deadline = start + seconds

    async def worker(w: int) -> None:
        i = 0
        while time.perf_counter() < deadline:
            await put(w, i)
            i += 1
        counts[w] = i

    async with asyncio.TaskGroup() as tg:
        for w in range(CONCURRENCY):
            tg.create_task(worker(w))
    return sum(counts) / (time.perf_counter() - start)


async def parallel_puts(store: MetadataStore, seconds: float) -> float:
    async def put(w: int, i: int) -> object:
        return await store.put(f"/bench/par/{w:02d}/{i:08d}", VALUE)

    return await in_flight(seconds, put)


async def indexed_puts(store: MetadataStore, seconds: float) -> float:
    async def put(w: int, i: int) -> object:
        n = i * CONCURRENCY + w
        indexes: dict[str, str | int | tuple[str | int, ...]] = {
            "writes-by-segment": f"seg-{n % 8}",
            "txn-by-deadline": n,
        }
        return await store.put(f"/bench/idx/{w:02d}/{i:08d}", VALUE, indexes=indexes)

    return await in_flight(seconds, put)


async def sequential_key_puts(store: MetadataStore, seconds: float) -> float:
    async def put(w: int, i: int) -> object:
        return await store.put(f"/bench/seq/p{w % SEQ_PREFIXES}/", VALUE, sequential=True)

    return await in_flight(seconds, put)


async def watch_latency(
    store: MetadataStore, max_samples: int, seconds: float
) -> tuple[float, float, int]:
    """p50, p99 (seconds) and sample count of put-to-event latency on one prefix."""
    prefix = "/bench/watch/"
    arrivals: asyncio.Queue[tuple[str, float]] = asyncio.Queue()
    samples: list[float] = []
    async with store.watch_prefix(prefix) as events:

        async def follow() -> None:
            async for ev in events:
                if ev.kind is EventKind.PUT:
                    arrivals.put_nowait((ev.key, time.perf_counter()))

        watcher = asyncio.create_task(follow())
        try:
            deadline = time.perf_counter() + seconds
            for i in range(max_samples):
                if i >= 50 and time.perf_counter() >= deadline:
                    break
                key = f"{prefix}{i:08d}"
                t0 = time.perf_counter()
                await store.put(key, VALUE)
                got, arrived = await asyncio.wait_for(arrivals.get(), timeout=10)
                if got != key:
                    raise RuntimeError(f"watch delivered {got!r}, expected {key!r}")
                samples.append(arrived - t0)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
    samples.sort()
    return percentile(samples, 50), percentile(samples, 99), len(samples)


async def run_backend(backend: str, url: str, seconds: float) -> Result:
    result = Result(backend)
    store = open_store(url)
    try:
        for i in range(50):  # warm-up: connections, code paths
            await store.put(f"/bench/warmup/{i}", VALUE)
        result.throughput["sequential CAS puts/s"] = await cas_puts(store, seconds)
        result.throughput["puts/s, 64 in flight"] = await parallel_puts(store, seconds)
        result.throughput["indexed puts/s (2 idx), 64 in flight"] = await indexed_puts(
            store, seconds
        )
        result.throughput["sequential-key puts/s, 64 in flight"] = await sequential_key_puts(
            store, seconds
        )
        p50, p99, n = await watch_latency(store, WATCH_SAMPLES[backend], seconds)
        result.latency["watch put->event p50 (ms)"] = p50
        result.latency["watch put->event p99 (ms)"] = p99
        result.watch_samples = n
    finally:
        await store.close()
    return result


def etcd_version() -> str:
    try:
        out = subprocess.run(
            [find_etcd_binary(), "--version"],
            check=False,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        return f"etcd version unknown ({e})"
    return out.splitlines()[0] if out else "etcd version unknown"


def run_etcd(seconds: float) -> Result:
    server = EtcdServer.in_temp_dir()
    server.start()
    try:
        return asyncio.run(run_backend("etcd", server.url("/bench"), seconds))
    finally:
        server.stop()


def fmt_rate(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.3f}"


def print_table(results: dict[str, Result]) -> None:
    mem, etcd = results.get("memory"), results.get("etcd")
    rows: list[tuple[str, str, str, str]] = [("metric", "memory", "etcd", "etcd/memory")]
    first = mem or etcd
    assert first is not None

    def ratio(a: float | None, b: float | None) -> str:
        return "-" if a is None or b is None or a == 0 else f"{b / a:.3f}x"

    for name in first.throughput:
        m = mem.throughput[name] if mem else None
        e = etcd.throughput[name] if etcd else None
        rows.append((name, fmt_rate(m), fmt_rate(e), ratio(m, e)))
    for name in first.latency:
        m = mem.latency[name] if mem else None
        e = etcd.latency[name] if etcd else None
        rows.append((name, fmt_ms(m), fmt_ms(e), ratio(m, e)))
    widths = [max(len(r[c]) for r in rows) for c in range(4)]
    for j, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [row[c].rjust(widths[c]) for c in range(1, 4)]
        print("  ".join(cells))
        if j == 0:
            print("  ".join("-" * w for w in widths))
    samples = ", ".join(f"{r.backend} {r.watch_samples}" for r in results.values())
    print(f"(watch latency samples: {samples})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--seconds", type=float, default=2.0, help="duration of each measurement (default 2)"
    )
    parser.add_argument("--only", choices=["memory", "etcd"], help="run one backend only")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    print(f"segtxn metastore bench: {args.seconds:g} s per measurement, {os.cpu_count()} CPUs")
    results: dict[str, Result] = {}
    if args.only in (None, "memory"):
        results["memory"] = asyncio.run(run_backend("memory", "memory://", args.seconds))
    if args.only in (None, "etcd"):
        print(f"{etcd_version()} (single member, fsync on)")
        results["etcd"] = run_etcd(args.seconds)
    print()
    print_table(results)
    print(f"\ntotal run time: {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
