"""``bench/replication.py``'s first half: produce throughput and send latency on both
clusters side by side (one at a time and pipelined), ``bench/txn.py``'s transactional
consume-transform-produce loop on both, and the table and ratios it prints.

It is a module of its own because it shares nothing with the take-over trials
(``takeover.py``) but the clusters (``replclusters.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from common import percentile, print_rows
from replclusters import NAMESPACE, Cluster, Settings, new_producer
from txn import pipeline
from txnresults import PipelineResult

from segtxn.client import Client, MessageId, Producer

IN_FLIGHT = 256
"""Messages in flight per producer, pipelined."""
WARMUP_S = 0.5
ONE_AT_A_TIME = "one at a time"
PIPELINED = "pipelined"
MODES = (ONE_AT_A_TIME, PIPELINED)
CTP_BATCH = 100
"""Messages per transaction in the consume-transform-produce loop."""


@dataclass
class LoadResult:
    cluster: str
    mode: str
    messages: int
    seconds: float
    latencies: list[float]

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds


def failure_of(send: asyncio.Future[MessageId]) -> BaseException | None:
    """Why ``send`` was not stored, once its producer is flushed (None: it was)."""
    if not send.done():
        return RuntimeError("still unsettled after its producer was flushed")
    if send.cancelled():
        return asyncio.CancelledError()
    return send.exception()


async def produce(cluster: Cluster, mode: str, tag: str, settings: Settings) -> LoadResult:
    """``settings.producers`` producers on a fresh topic for one window."""
    topic = f"{NAMESPACE}/{tag}"
    pipelined = mode == PIPELINED
    payload = b"x" * settings.size
    async with Client(cluster.urls) as client:
        await client.admin.create_topic(topic)
        senders = [
            await new_producer(
                client,
                topic,
                f"{tag}-{i}",
                batching=pipelined,
                max_pending=IN_FLIGHT if pipelined else 1,
            )
            for i in range(settings.producers)
        ]
        start = time.perf_counter() + WARMUP_S
        end = start + settings.seconds
        acked = 0
        latencies: list[float] = []

        def settled(sent: float) -> Callable[[asyncio.Future[MessageId]], None]:
            def done(future: asyncio.Future[MessageId]) -> None:
                nonlocal acked
                if future.cancelled() or future.exception() is not None:
                    return  # (counted from the sends at the end)
                now = time.perf_counter()
                if start <= now < end:
                    acked += 1
                if start <= sent < end:
                    latencies.append(now - sent)

            return done

        sends: list[asyncio.Future[MessageId]] = []

        async def pump(sender: Producer) -> None:
            while time.perf_counter() < end:
                sent = time.perf_counter()
                future = await sender.send_async(payload)
                future.add_done_callback(settled(sent))
                sends.append(future)
                if not pipelined:
                    await future

        async with asyncio.TaskGroup() as tg:
            for i, sender in enumerate(senders):
                tg.create_task(pump(sender), name=f"pump-{tag}-{i}")
        for sender in senders:
            await sender.flush()
        # read from the sends, not counted by their callbacks: flush() returns before the
        # loop has run the last ones' callbacks, and a failure among those went unseen
        failures = [failure_of(f) for f in sends if failure_of(f) is not None]
    if failures:
        raise RuntimeError(f"{cluster.name}, {mode}: {len(failures)} sends failed") from failures[0]
    return LoadResult(cluster.name, mode, acked, settings.seconds, latencies)


async def load_rounds(
    plain: Cluster, replicated: Cluster, settings: Settings
) -> list[tuple[LoadResult, LoadResult]]:
    """Every mode on both clusters, in turns; (unreplicated, replicated) pairs."""
    pairs: list[tuple[LoadResult, LoadResult]] = []
    for r in range(1, settings.rounds + 1):
        for mode in MODES:
            order = [plain, replicated] if r % 2 else [replicated, plain]
            results: dict[str, LoadResult] = {}
            for cluster in order:
                tag = f"{'r3' if cluster is replicated else 'r1'}-{mode.replace(' ', '-')}-{r}"
                results[cluster.name] = await produce(cluster, mode, tag, settings)
            pairs.append((results[plain.name], results[replicated.name]))
    return pairs


async def ctp_rounds(
    plain: Cluster, replicated: Cluster, settings: Settings
) -> list[tuple[PipelineResult, PipelineResult]]:
    """``bench/txn.py``'s transactional consume-transform-produce loop on both clusters, in
    turns, once per round; (unreplicated, replicated) pairs."""
    pairs: list[tuple[PipelineResult, PipelineResult]] = []
    if not settings.ctp_messages:
        return pairs
    for r in range(1, settings.rounds + 1):
        results: dict[str, PipelineResult] = {}
        for cluster in [plain, replicated] if r % 2 else [replicated, plain]:
            async with Client(cluster.urls, prestart_transactions=True) as client:
                results[cluster.name] = await pipeline(
                    client,
                    r,
                    CTP_BATCH,
                    settings.ctp_messages,
                    transactional=True,
                    metrics=cluster.metrics_url,
                )
        pairs.append((results[plain.name], results[replicated.name]))
    return pairs


# ---------------------------------------------------------------------- output


def ms(v: float) -> str:
    return f"{v * 1000:.2f}"


def print_load(
    pairs: list[tuple[LoadResult, LoadResult]],
    ctp: list[tuple[PipelineResult, PipelineResult]],
    settings: Settings,
) -> None:
    print(
        f"produce: {settings.producers} producers on one persistent topic, {settings.size} B "
        f"messages, {settings.seconds:g} s windows after {WARMUP_S:g} s warm-up, "
        f"{settings.rounds} round{'s' if settings.rounds > 1 else ''}"
    )
    rows: list[tuple[str, ...]] = [("mode", "cluster", "msgs/s", "p50 ms", "p99 ms")]
    ratios: list[str] = []
    for mode in MODES:
        mine = [p for p in pairs if p[0].mode == mode]
        pooled: list[tuple[float, float, float]] = []
        for side in (0, 1):
            results = [p[side] for p in mine]
            rate = sum(r.messages for r in results) / sum(r.seconds for r in results)
            latencies = sorted(s for r in results for s in r.latencies)
            p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
            pooled.append((rate, p50, p99))
            rows.append((mode, results[0].cluster, f"{rate:,.0f}", ms(p50), ms(p99)))
        per_round = [r.msgs_per_s / u.msgs_per_s for u, r in mine if u.messages]
        (u_rate, u_p50, u_p99), (r_rate, r_p50, r_p99) = pooled
        ratios.append(
            f"{mode}: replicated ÷ unreplicated: msgs/s {r_rate / u_rate:.2f}x "
            f"(rounds {min(per_round):.2f}-{max(per_round):.2f}x), "
            f"p50 {r_p50 / u_p50:.2f}x, p99 {r_p99 / u_p99:.2f}x"
        )
    print_rows(rows, left=2)
    print(
        f"(one at a time: one message in flight per producer; pipelined: up to {IN_FLIGHT} "
        f"per producer, batching on; latency: send_async to receipt)"
    )
    for line in ratios:
        print(line)
    if not ctp:
        return
    plain_rate, replicated_rate = (
        sum(pair[side].messages for pair in ctp) / sum(pair[side].elapsed for pair in ctp)
        for side in (0, 1)
    )
    per_round = [r.msgs_per_s / u.msgs_per_s for u, r in ctp]
    print(
        f"txn consume-transform-produce ({settings.ctp_messages} messages, {CTP_BATCH} per "
        f"transaction, 4-segment topics, as bench/txn.py (c)): unreplicated "
        f"{plain_rate:,.0f} msgs/s, replicated {replicated_rate:,.0f} msgs/s; replicated ÷ "
        f"unreplicated {replicated_rate / plain_rate:.2f}x (rounds {min(per_round):.2f}-"
        f"{max(per_round):.2f}x)"
    )
