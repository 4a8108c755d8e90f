"""Broker benchmark: produce throughput and publish-to-receive latency, next to the raw ledger.

A broker runs in a **separate process** (this script started again with a hidden
``--serve-broker`` flag), so the clients' event loop and the broker's do not share a core:
a :class:`~segtxn.broker.app.BrokerServer` on loopback, with a ``memory://`` metadata store
and ``file://`` managed ledgers in a temporary directory created under the repository (the
repository's disk, never tmpfs; removed at the end). The metadata store is the same
``memory://`` kind the raw-ledger rows use, so the comparison is about the broker (WebSocket
frames, de-duplication, entry encoding, receipts), not about etcd. All clients run in this
process, through the public :class:`~segtxn.client.Client`. Messages are 100 B payloads; the
broker stores each as one ledger entry (payload plus producer name, sequence id, publish
time: the entry size is printed).

It measures, for **1 and 8 producers** (each on its own ``persistent://`` topic, so each has
its own ledger, group-commit writer and de-duplication state, and none waits on another's
ordering), each with **batching on and off** (4 configurations):

1. **produce throughput** (msgs/s, MB/s of payload, 10^6 B): every producer keeps up to
   ``max_pending`` = 1000 messages in flight with ``send_async``; a message counts when its
   receipt (durable) arrives inside the measurement window, which starts after a warm-up.
   No subscription exists, so this is the produce path alone. ``avg batch`` is entries per
   ``fdatasync`` in the broker's ledgers (from the topic stats).
2. **saturated publish-to-receive latency**: the same load on fresh topics with one
   Exclusive consumer per topic (from ``earliest``, never acknowledging: acks are not
   measured) receiving in this process. The send time (``perf_counter_ns``) is the first 8
   bytes of the payload, taken just before ``send_async`` (so it includes waiting for room
   in the window); a sample is receive time minus send time, for messages sent inside the
   window. With 1000 in flight this is mostly queueing (Little's law: in-flight / rate).
   The throughput reached with consumers attached is printed next to it.
3. **paced latency**: 1 producer at a fixed ~1000 msgs/s (``asyncio.sleep`` to a schedule)
   with one consumer, batching on and off: send-to-receipt (durable) and publish-to-receive
   p50/p99, i.e. latency when nothing queues.

In the same run, before the broker starts, it measures the **raw ledger** in this process:
a :class:`~segtxn.ledger.ManagedLedger` on :class:`~segtxn.ledger.FileLogStorage` in the
same directory with default :class:`~segtxn.ledger.LedgerSettings` (the broker's), 1000
concurrent ``append`` tasks of 100 B entries per ledger, for 1 ledger and for 8 ledgers
(the shapes of 1 and 8 producers with 1000 in flight each). Each broker row's ``÷ raw`` is
its msgs/s over the appends/s of the raw row with the same number of ledgers: how much of
the ledger's append rate survives the broker and its clients.

Every measurement is a time-bounded loop (``--seconds`` after a short warm-up). The
machine's cores are shared by the broker process and this one (which runs all producers and
consumers), so read the numbers as side-by-side ratios from one run, not absolute figures.

Run: ``.venv/bin/python bench/broker.py [--seconds S]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from common import file_ledger_broker, filesystem_of, percentile, print_rows, until_signalled

from segtxn.broker.entry import StoredMessage, encode_entry
from segtxn.client import Client, Consumer, MessageId
from segtxn.ledger import FileLogStorage, LedgerSettings, ManagedLedger
from segtxn.metastore import open_store
from segtxn.metastore.etcd_server import free_port

REPO = Path(__file__).resolve().parent.parent
SIZE = 100
STAMP = 8  # bytes of the send timestamp at the head of each payload
PADDING = b"p" * (SIZE - STAMP)
MAX_PENDING = 1000
PRODUCERS = (1, 8)
BATCHING = (True, False)
PACED_RATE = 1000.0
WARMUP_S = 0.5
DRAIN_TIMEOUT_S = 30.0
READY_TIMEOUT_S = 30.0
NAMESPACE = "persistent://bench/ns"


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
        await asyncio.sleep(max(0.0, self.start - time.perf_counter()))
        t0, c0 = time.perf_counter(), counter()
        await asyncio.sleep(max(0.0, self.end - time.perf_counter()))
        t1, c1 = time.perf_counter(), counter()
        return c1 - c0, t1 - t0


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


# ---------------------------------------------------------------------- the broker process


async def serve_broker(port: int, ledger_dir: Path) -> None:
    """The broker side (``--serve-broker``): serve until SIGTERM or SIGINT."""
    server = file_ledger_broker(port, ledger_dir)
    await server.start()
    try:
        await until_signalled()
    finally:
        await server.stop()


def wait_ready(process: subprocess.Popen[bytes], url: str) -> None:
    """Poll ``/readyz`` until it answers 200 (bounded)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the broker exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)  # process start-up: nothing to wait on but the port
    raise RuntimeError(f"the broker was not ready within {READY_TIMEOUT_S:g} s")


@contextlib.contextmanager
def broker_process(ledger_dir: Path) -> Iterator[str]:
    """Run the broker in a child process; yields its URL; stops it (or kills it)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--serve-broker",
            str(port),
            str(ledger_dir),
        ]
    )
    try:
        wait_ready(process, url)
        yield url
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


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
    url: str, tag: str, producers: int, batching: bool, seconds: float, *, consume: bool
) -> ProduceResult:
    """``producers`` producers, each on its own fresh topic with ``MAX_PENDING`` in flight."""
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
        stored = [0] * producers
        failures: list[BaseException] = []

        def settled(i: int) -> Callable[[asyncio.Future[MessageId]], None]:
            def done(future: asyncio.Future[MessageId]) -> None:
                if future.cancelled():
                    return
                error = future.exception()
                if error is None:
                    stored[i] += 1
                else:
                    failures.append(error)

            return done

        async def pump(i: int) -> None:
            sender, on_done = senders[i], settled(i)
            while time.perf_counter() < window.end:
                future = await sender.send_async(stamped(time.perf_counter_ns()))
                future.add_done_callback(on_done)

        async with asyncio.TaskGroup() as tg:
            for i in range(producers):
                tg.create_task(pump(i))
            messages, elapsed = await window.measure(lambda: sum(stored))
        for sender in senders:
            await sender.flush()
        if failures:
            raise RuntimeError(f"{len(failures)} sends failed") from failures[0]
        result = ProduceResult(producers, batching, messages, elapsed)
        if consume:
            result.missing = await drain(probes, stored)
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
        stored = 0
        failures: list[BaseException] = []

        def settled(sent_ns: int) -> Callable[[asyncio.Future[MessageId]], None]:
            def done(future: asyncio.Future[MessageId]) -> None:
                nonlocal stored
                if future.cancelled():
                    return
                error = future.exception()
                if error is not None:
                    failures.append(error)
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
                n += 1

        async with asyncio.TaskGroup() as tg:
            tg.create_task(pump())
            messages, elapsed = await window.measure(lambda: stored)
        await sender.flush()
        if failures:
            raise RuntimeError(f"{len(failures)} sends failed") from failures[0]
        missing = await drain([probe], [stored])
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
    url: str, seconds: float
) -> tuple[list[tuple[ProduceResult, ProduceResult]], list[PacedResult]]:
    saturated_rows: list[tuple[ProduceResult, ProduceResult]] = []
    for producers in PRODUCERS:
        for batching in BATCHING:
            tag = f"{producers}p-{'batch' if batching else 'single'}"
            alone = await saturated(url, f"tput-{tag}", producers, batching, seconds, consume=False)
            consumed = await saturated(
                url, f"e2e-{tag}", producers, batching, seconds, consume=True
            )
            saturated_rows.append((alone, consumed))
    paced_rows = [
        await paced(url, f"paced-{'batch' if b else 'single'}", b, PACED_RATE, seconds)
        for b in BATCHING
    ]
    return saturated_rows, paced_rows


# ---------------------------------------------------------------------- output


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
            )
        )
    print_rows(rows)
    print(
        f"(÷ raw: broker msgs/s over raw ledger appends/s with as many ledgers, 100 B, same "
        f"directory; +consumer: the same load on fresh topics with one consumer each, whose "
        f"publish-to-receive latency is e2e; {MAX_PENDING} in flight per producer)"
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


def stored_entry_size() -> int:
    """Bytes of the ledger entry the broker writes for one 100 B message."""
    message = StoredMessage(
        producer_name="tput-8p-single-7",
        sequence_id=123_456,
        publish_time_ms=int(time.time() * 1000),
        payload=stamped(time.perf_counter_ns()),
    )
    return len(encode_entry(message))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--seconds", type=float, default=2.0, help="duration of each measurement (default 2)"
    )
    parser.add_argument("--serve-broker", nargs=2, metavar=("PORT", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_broker:
        port, ledger_dir = args.serve_broker
        asyncio.run(serve_broker(int(port), Path(ledger_dir)))
        return 0
    seconds: float = args.seconds

    started = time.perf_counter()
    directory = Path(tempfile.mkdtemp(prefix=".bench-ledger-broker-", dir=REPO))
    try:
        print(
            f"segtxn broker bench: {seconds:g} s per measurement after {WARMUP_S:g} s warm-up, "
            f"{os.cpu_count()} CPUs, files in {directory} ({filesystem_of(directory)}); "
            f"{SIZE} B messages, stored as {stored_entry_size()} B entries by the broker"
        )
        raw = {n: asyncio.run(raw_ledger(directory, n, MAX_PENDING, seconds)) for n in PRODUCERS}
        with broker_process(directory / "broker") as url:
            saturated_rows, paced_rows = asyncio.run(broker_runs(url, seconds))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print()
    print_tables(raw, saturated_rows, paced_rows)
    print(f"\ntotal run time: {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
