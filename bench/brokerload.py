"""``bench/broker.py``'s measurements: raw ledger appends in this process, and the
saturated and paced producers and consumers that run against the broker process, each in a
time-bounded window.

It is a module of its own so that the script holds only the broker's child process and the
run's order, and the results and tables (``brokerresults.py``) only the reporting.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path

from brokerresults import MAX_PENDING, PACED_RATE, SIZE, PacedResult, ProduceResult, RawResult
from common import percentile
from peerlib import tree_cpu

from segtxn.client import Client, Consumer, MessageId
from segtxn.ledger import FileLogStorage, LedgerSettings, ManagedLedger
from segtxn.metastore import open_store

STAMP = 8  # bytes of the send timestamp at the head of each payload
PADDING = b"p" * (SIZE - STAMP)
PRODUCERS = (1, 8)
BATCHING = (True, False)
WARMUP_S = 0.5
DRAIN_TIMEOUT_S = 30.0
NAMESPACE = "persistent://bench/ns"


def stamped(now_ns: int) -> bytes:
    """A 100 B payload whose first 8 bytes are ``now_ns``."""
    return now_ns.to_bytes(STAMP, "little") + PADDING


class Window:
    """The measurement window: counts of ``counter()`` at its start and end, and when."""

    def __init__(self, warmup: float, seconds: float) -> None:
        self.start = time.perf_counter() + warmup
        self.end = self.start + seconds
        self.start_ns = int(self.start * 1e9)
        self.end_ns = int(self.end * 1e9)

    def contains_ns(self, t_ns: int) -> bool:
        return self.start_ns <= t_ns < self.end_ns

    async def measure(self, counter: Callable[[], int]) -> tuple[int, float]:
        """Sleep through the window; the count it saw and its real length (a late wake-up
        on a busy loop moves the edges, not the rate)."""
        count, elapsed, _ = await self.measure_cpu(counter, None)
        return count, elapsed

    async def measure_cpu(
        self, counter: Callable[[], int], server: int | None
    ) -> tuple[int, float, tuple[float, float]]:
        """:meth:`measure`, and the CPU seconds the ``server`` process and this one (the
        client) used in the window: on a shared machine a rate moves with the other work,
        the CPU a message costs much less."""
        await asyncio.sleep(max(0.0, self.start - time.perf_counter()))
        t0, c0 = time.perf_counter(), counter()
        s0, p0 = tree_cpu(server), time.process_time()
        await asyncio.sleep(max(0.0, self.end - time.perf_counter()))
        t1, c1 = time.perf_counter(), counter()
        s1, p1 = tree_cpu(server), time.process_time()
        return c1 - c0, t1 - t0, (s1 - s0, p1 - p0)


# ---------------------------------------------------------------------- raw ledger


async def raw_ledger(directory: Path, ledgers: int, appenders: int, seconds: float) -> RawResult:
    """``appenders`` tasks per ledger appending 100 B entries until the window closes."""
    store = open_store("memory://")
    storage = FileLogStorage(directory / "raw")
    payload = b"r" * SIZE
    opened: list[ManagedLedger] = []
    done = 0
    try:
        for i in range(ledgers):
            opened.append(
                await ManagedLedger.open(f"raw-{ledgers}-{i}", store, storage, LedgerSettings())
            )
        window = Window(WARMUP_S, seconds)

        async def worker(ledger: ManagedLedger) -> None:
            nonlocal done
            while time.perf_counter() < window.end:
                await ledger.append(payload)
                done += 1

        async with asyncio.TaskGroup() as tg:
            for ledger in opened:
                for _ in range(appenders):
                    tg.create_task(worker(ledger))
            appends, elapsed = await window.measure(lambda: done)
        entries = sum(ledger.stats.entries for ledger in opened)
        batches = sum(ledger.stats.batches for ledger in opened)
    finally:
        for ledger in opened:
            await ledger.close()
        await store.close()
    return RawResult(ledgers, appenders, appends, elapsed, entries, batches)


# ---------------------------------------------------------------------- broker clients


class Probe:
    """Receives every message of one consumer and samples publish-to-receive latency for
    those sent inside the window."""

    def __init__(self, consumer: Consumer, window: Window) -> None:
        self.consumer = consumer
        self.window = window
        self.samples: list[float] = []
        self.received = 0
        self.expected: int | None = None
        self.caught_up = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            message = await self.consumer.receive()
            now = time.perf_counter_ns()
            sent = int.from_bytes(message.value[:STAMP], "little")
            if self.window.contains_ns(sent):
                self.samples.append((now - sent) / 1e9)
            self.received += 1
            if self.expected is not None and self.received >= self.expected:
                self.caught_up.set()

    def expect(self, total: int) -> None:
        self.expected = total
        if self.received >= total:
            self.caught_up.set()

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


class Tally:
    """A producer's sends, counted as they settle, so that the run does not keep them: a
    list of every send's future (about 250,000 in a window of 5 s) was walked by each of
    the client process's full garbage collections, which then took about 85 ms each and
    about a fifth of the client's CPU (a ``gc.callbacks`` timer), slowing the producer
    this bench measures the broker with."""

    def __init__(self) -> None:
        self.made = 0
        self.settled = 0
        self.failures: list[BaseException] = []
        self._all_settled = asyncio.Event()
        self._closed = False

    def track(self, future: asyncio.Future[MessageId]) -> None:
        self.made += 1
        future.add_done_callback(self._done)

    def _done(self, future: asyncio.Future[MessageId]) -> None:
        self.settled += 1
        if future.cancelled():
            self.failures.append(asyncio.CancelledError())
        elif (error := future.exception()) is not None:
            self.failures.append(error)
        if self._closed and self.settled == self.made:
            self._all_settled.set()

    async def stored(self) -> int:
        """How many sends were stored, once the producer is flushed and no more are made:
        waits (bounded) for the done callbacks of the last ones, which
        :meth:`Producer.flush` returns before (a count taken at once was short, and the
        consumer was then expected to get fewer messages than were stored).

        Raises:
            RuntimeError: a send failed, or some did not settle (the bench stores every
                message or says so).
        """
        self._closed = True
        if self.settled == self.made:
            self._all_settled.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DRAIN_TIMEOUT_S):
                await self._all_settled.wait()
        if self.failures or self.settled != self.made:
            cause = self.failures[0] if self.failures else None
            unsettled = self.made - self.settled
            raise RuntimeError(
                f"{len(self.failures)} sends failed, {unsettled} were left unsettled"
            ) from cause
        return self.made


async def drain(probes: list[Probe], sent: list[int]) -> int:
    """Wait (bounded) until every probe received what its producer stored; the shortfall."""
    for probe, total in zip(probes, sent, strict=True):
        probe.expect(total)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(DRAIN_TIMEOUT_S):
            await asyncio.gather(*(p.caught_up.wait() for p in probes))
    for probe in probes:
        if probe.task.done() and not probe.task.cancelled() and probe.task.exception():
            raise RuntimeError("a consumer failed") from probe.task.exception()
        await probe.stop()
    return sum(max(0, total - p.received) for p, total in zip(probes, sent, strict=True))


def latency_of(probes: list[Probe]) -> tuple[float | None, float | None, int]:
    samples = sorted(s for p in probes for s in p.samples)
    if not samples:
        return None, None, 0
    return percentile(samples, 50), percentile(samples, 99), len(samples)


async def saturated(
    url: str,
    tag: str,
    producers: int,
    batching: bool,
    seconds: float,
    *,
    consume: bool,
    server: int | None = None,
) -> ProduceResult:
    """``producers`` producers, each on its own fresh topic with ``MAX_PENDING`` in flight;
    ``server``: the broker's pid, whose CPU is measured with the client's."""
    topics = [f"{NAMESPACE}/{tag}-{i}" for i in range(producers)]
    async with Client(url) as client:
        for topic in topics:
            await client.admin.create_topic(topic)
        consumers = [
            await client.subscribe(
                topic, "bench", initial_position="earliest", receiver_queue_size=1000
            )
            for topic in (topics if consume else [])
        ]
        senders = [
            await client.create_producer(
                topic, name=f"{tag}-{i}", batching=batching, max_pending=MAX_PENDING
            )
            for i, topic in enumerate(topics)
        ]
        window = Window(WARMUP_S, seconds)
        probes = [Probe(consumer, window) for consumer in consumers]
        stored = [0] * producers  # durable so far: what the window counts
        tallies = [Tally() for _ in range(producers)]

        def count(i: int) -> Callable[[asyncio.Future[MessageId]], None]:
            def done(future: asyncio.Future[MessageId]) -> None:
                if not future.cancelled() and future.exception() is None:
                    stored[i] += 1

            return done

        async def pump(i: int) -> None:
            sender, on_done = senders[i], count(i)
            while time.perf_counter() < window.end:
                future = await sender.send_async(stamped(time.perf_counter_ns()))
                future.add_done_callback(on_done)
                tallies[i].track(future)

        async with asyncio.TaskGroup() as tg:
            for i in range(producers):
                tg.create_task(pump(i))
            messages, elapsed, cpu = await window.measure_cpu(lambda: sum(stored), server)
        for sender in senders:
            await sender.flush()
        totals = [await tally.stored() for tally in tallies]
        result = ProduceResult(producers, batching, messages, elapsed, *cpu)
        if consume:
            result.missing = await drain(probes, totals)
            result.p50, result.p99, result.samples = latency_of(probes)
        for topic in topics:
            storage = (await client.admin.stats(topic))["storage"]
            result.entries += int(storage["entriesWritten"])
            result.batches += int(storage["batches"])
    return result


async def paced(url: str, tag: str, batching: bool, rate: float, seconds: float) -> PacedResult:
    """One producer sending on a fixed schedule of ``rate`` msgs/s, one consumer."""
    topic = f"{NAMESPACE}/{tag}"
    async with Client(url) as client:
        await client.admin.create_topic(topic)
        consumer = await client.subscribe(
            topic, "bench", initial_position="earliest", receiver_queue_size=1000
        )
        sender = await client.create_producer(
            topic, name=tag, batching=batching, max_pending=MAX_PENDING
        )
        window = Window(WARMUP_S, seconds)
        probe = Probe(consumer, window)
        durable: list[float] = []
        stored = 0  # durable so far: what the window counts
        tally = Tally()

        def settled(sent_ns: int) -> Callable[[asyncio.Future[MessageId]], None]:
            def done(future: asyncio.Future[MessageId]) -> None:
                nonlocal stored
                if future.cancelled() or future.exception() is not None:
                    return
                stored += 1
                if window.contains_ns(sent_ns):
                    durable.append((time.perf_counter_ns() - sent_ns) / 1e9)

            return done

        async def pump() -> None:
            interval = 1 / rate
            begin = time.perf_counter()
            n = 0
            while (due := begin + n * interval) < window.end:
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                sent_ns = time.perf_counter_ns()
                future = await sender.send_async(stamped(sent_ns))
                future.add_done_callback(settled(sent_ns))
                tally.track(future)
                n += 1

        async with asyncio.TaskGroup() as tg:
            tg.create_task(pump())
            messages, elapsed = await window.measure(lambda: stored)
        await sender.flush()
        missing = await drain([probe], [await tally.stored()])
    durable.sort()
    e2e = sorted(probe.samples)
    if not durable or not e2e:
        raise RuntimeError("the paced run collected no samples")
    return PacedResult(
        batching=batching,
        messages=messages,
        elapsed=elapsed,
        durable_p50=percentile(durable, 50),
        durable_p99=percentile(durable, 99),
        e2e_p50=percentile(e2e, 50),
        e2e_p99=percentile(e2e, 99),
        samples=len(e2e),
        missing=missing,
    )


async def broker_runs(
    url: str, server: int | None, seconds: float
) -> tuple[list[tuple[ProduceResult, ProduceResult]], list[PacedResult]]:
    saturated_rows: list[tuple[ProduceResult, ProduceResult]] = []
    for producers in PRODUCERS:
        for batching in BATCHING:
            tag = f"{producers}p-{'batch' if batching else 'single'}"
            alone = await saturated(
                url, f"tput-{tag}", producers, batching, seconds, consume=False, server=server
            )
            consumed = await saturated(
                url, f"e2e-{tag}", producers, batching, seconds, consume=True, server=server
            )
            saturated_rows.append((alone, consumed))
    paced_rows = [
        await paced(url, f"paced-{'batch' if b else 'single'}", b, PACED_RATE, seconds)
        for b in BATCHING
    ]
    return saturated_rows, paced_rows
