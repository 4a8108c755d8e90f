"""Scaling benchmark: producer throughput as a scalable topic splits 1 -> 2 -> 4 segments
across two brokers, and the pause a producer observes at each split.

The script starts a private single-member etcd (``EtcdServer.in_temp_dir()``: data on
``/dev/shm`` when it exists, fsync on) and **two brokers**, each a separate process
(``python -m segtxn.cli broker``); no coordinator (no transactions here). Broker ledgers go to
a temporary ``.bench-ledger-scaling-*`` directory under the repository (removed at the end).
The client goes through the public :class:`~segtxn.client.Client`, connected to the first
broker.

One :class:`~segtxn.client.ScalableProducer` sends without pause for the whole run: 100-byte
payloads, keys drawn from a pool of ``KEYS`` random keys, at most ``IN_FLIGHT`` sends in
flight (``send_async``, then awaiting the oldest when the window is full). A send's latency is
the time from the ``send_async`` call to its future resolving (the message is durable). The
run is a sequence of phases on one topic that starts with one segment:

1. **steady, 1 segment** (``--seconds``);
2. **split** segment 0 while producing; then **steady, 2 segments**;
3. **split** both active segments, one after the other (a topic runs one split at a time),
   while producing; then **steady, 4 segments**.

A steady phase's throughput counts the sends that resolved in it; its latencies cover the
sends started in it. A split's *window* runs from the ``split`` call until 0.5 s after it
returned; its latencies cover every send in flight at any time in the window (the ones the
split held up), compared with the p99 of the steady phase before it. ``reroutes`` counts the
sends that reached the sealed parent and went again to a child (nothing stored twice).

At the end one consumer (Exclusive, from the earliest position) reads the whole topic and
acknowledges every message (a child segment is delivered only after its parent is consumed
and acknowledged to its end): every acknowledged send must arrive exactly once, and each
key's messages in the order they were sent. The message ids the producer got back are
checked too (a key's sends stored in one segment in the order they were made), which tells a
producer-side reordering from a consumer-side one.

Both brokers, etcd and this process (the client) share the machine's cores (two on the
machine this was written on), so absolute throughput does not grow with the number of
segments here: read the ratios, which show what a split costs the producer.

Run: ``.venv/bin/python bench/scaling.py [--seconds S]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import math
import os
import random
import shutil
import string
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from common import ServerProcess, exit_on_sigterm, percentile
from scalingresults import (
    AFTER_SPLIT_S,
    IN_FLIGHT,
    KEYS,
    PAYLOAD_BYTES,
    Phase,
    Results,
    Split,
    Verification,
    passed,
    print_tables,
)

from segtxn.client import Client, Consumer, Message, MessageId, ScalableProducer
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.protocol.names import TopicName

REPO = Path(__file__).resolve().parent.parent
TOPIC = "topic://bench/scale/t"
SUBSCRIPTION = "verify"
BROKERS = 2
WARMUP_S = 0.5
RUN_LIMIT_S = 180.0
"""The producing part taking longer than this has hung: it fails instead of waiting forever."""
VERIFY_IDLE_S = 10.0
"""The consumer receiving nothing for this long while messages are missing: it fails."""
ACKS_IN_FLIGHT = 1000
EXAMPLES = 5


# ---------------------------------------------------------------------- the cluster


@contextlib.contextmanager
def cluster(directory: Path) -> Iterator[list[ServerProcess]]:
    """A private etcd (fsync on) and two brokers; stopped at the end."""
    etcd = EtcdServer.in_temp_dir()
    etcd.start()
    brokers: list[ServerProcess] = []
    try:
        store = etcd.url("/scaling")
        for i in range(BROKERS):
            command = ["broker", "--store", store, "--broker-id", f"b{i}"]
            command += ["--data-dir", str(directory / f"b{i}")]
            brokers.append(ServerProcess(f"b{i}", command, directory / f"b{i}.log"))
        for broker in brokers:
            broker.start()
        for broker in brokers:
            broker.wait_ready()
        yield brokers
    finally:
        for broker in reversed(brokers):
            broker.stop()
        etcd.stop()


# ---------------------------------------------------------------------- the producer


@dataclass
class Send:
    seq: int
    key: str
    started: float
    ended: float = math.inf
    message_id: MessageId | None = None


@dataclass
class Load:
    """The producer loop's record of every send."""

    producer: ScalableProducer
    keys: list[str]
    sends: list[Send] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        """Send until ``stop`` is set, at most ``IN_FLIGHT`` in flight; then drain."""
        rng = random.Random(1)
        filler = b"x" * PAYLOAD_BYTES
        window: deque[asyncio.Future[MessageId]] = deque()
        while not self.stop.is_set():
            if len(window) >= IN_FLIGHT:
                await self._settle(window.popleft())
                continue
            seq = len(self.sends)
            send = Send(seq, rng.choice(self.keys), time.perf_counter())
            self.sends.append(send)
            payload = (f"{seq:012d}".encode() + filler)[:PAYLOAD_BYTES]
            future = await self.producer.send_async(payload, key=send.key)
            future.add_done_callback(functools.partial(self._resolved, send))
            window.append(future)
        while window:
            await self._settle(window.popleft())

    @staticmethod
    def _resolved(send: Send, future: asyncio.Future[MessageId]) -> None:
        send.ended = time.perf_counter()
        if not future.cancelled() and future.exception() is None:
            send.message_id = future.result()

    async def _settle(self, future: asyncio.Future[MessageId]) -> None:
        try:
            await future
        except Exception as e:  # reported at the end: a failed send is a finding
            self.errors.append(e)


# ---------------------------------------------------------------------- measurements


def measure_phase(load: Load, phase: Phase) -> None:
    """Sends resolved in the phase (throughput) and the latencies of those started in it."""
    for s in load.sends:
        if phase.start <= s.ended < phase.end and s.message_id is not None:
            phase.sent += 1
        if phase.start <= s.started < phase.end and s.ended < math.inf:
            phase.latencies.append(s.ended - s.started)


def measure_split(load: Load, split: Split) -> None:
    """Latencies of every send in flight at some time in the split's window."""
    for s in load.sends:
        if s.started < split.end and s.ended > split.start and s.ended < math.inf:
            split.latencies.append(s.ended - s.started)


async def steady(load: Load, name: str, segments: int, seconds: float) -> Phase:
    phase = Phase(name, segments, time.perf_counter(), 0.0)
    await asyncio.sleep(seconds)
    phase.end = time.perf_counter()
    return phase


async def split(client: Client, load: Load, segment: int, baseline_p99: float) -> Split:
    reroutes = load.producer.reroutes
    start = time.perf_counter()
    dag = await client.admin.split(TOPIC, segment)
    returned = time.perf_counter()
    children = sorted(
        int(s["id"]) for s in dag["segments"] if segment in s["parents"] and s["state"] == "ACTIVE"
    )
    await asyncio.sleep(AFTER_SPLIT_S)
    end = time.perf_counter()
    return Split(
        segment, children, start, returned, end, load.producer.reroutes - reroutes, baseline_p99
    )


async def placement(client: Client, names: dict[str, str]) -> list[tuple[int, int, int, str]]:
    layout = await client.connector.lookup(TopicName.parse(TOPIC))
    return [
        (int(s["id"]), int(s["lo"]), int(s["hi"]), names.get(s["brokerUrl"], s["brokerUrl"]))
        for s in sorted(layout["segments"], key=lambda s: int(s["lo"]))
        if s["state"] == "ACTIVE"
    ]


async def produce(client: Client, seconds: float, names: dict[str, str]) -> tuple[Results, Load]:
    results = Results()
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    assert isinstance(producer, ScalableProducer)
    rng = random.Random(0)
    keys = ["".join(rng.choices(string.ascii_lowercase, k=12)) for _ in range(KEYS)]
    load = Load(producer, keys)
    task = asyncio.create_task(load.run(), name="bench-producer")
    try:
        await asyncio.sleep(WARMUP_S)  # connections, code paths
        phases = [await steady(load, "steady", 1, seconds)]
        splits = [await split(client, load, 0, math.nan)]
        phases.append(await steady(load, "steady", 2, seconds))
        for segment in splits[0].children:
            splits.append(await split(client, load, segment, math.nan))
        phases.append(await steady(load, "steady", 4, seconds))
    finally:
        load.stop.set()
        await task
    for phase in phases:
        measure_phase(load, phase)
    for s in splits:
        before = [p for p in phases if p.end <= s.start][-1]
        s.baseline_p99 = percentile(before.latencies, 99)
        measure_split(load, s)
    results.phases, results.splits = phases, splits
    results.acked = sum(1 for s in load.sends if s.message_id is not None)
    results.errors = [repr(e) for e in load.errors]
    results.reroutes = producer.reroutes
    results.placement = await placement(client, names)
    return results, load


def stored_order(load: Load, result: Verification) -> None:
    """Per key and segment: were the sends stored in the order they were made?"""
    last: dict[tuple[str, str], Send] = {}
    for send in load.sends:  # in send order
        if send.message_id is None:
            continue
        where = (send.key, send.message_id.topic)
        before = last.get(where)
        earlier = None if before is None else before.message_id
        if before is not None and earlier is not None and earlier[1:] > send.message_id[1:]:
            result.stored_out_of_order += 1
            if len(result.examples) < EXAMPLES:
                result.examples.append(
                    f"key {send.key}: send #{send.seq} stored at {send.message_id}, "
                    f"before send #{before.seq} at {earlier}"
                )
            continue
        last[where] = send


async def verify(client: Client, load: Load) -> Verification:
    """Consume everything (Exclusive, from the earliest), acknowledging each message."""
    expected = {s.seq: s for s in load.sends if s.message_id is not None}
    result = Verification(len(expected))
    seen: set[int] = set()
    last_per_key: dict[str, tuple[int, MessageId]] = {}
    acks: set[asyncio.Task[None]] = set()
    ack_errors: list[BaseException] = []
    window = asyncio.Semaphore(ACKS_IN_FLIGHT)

    async def ack(consumer: Consumer, message: Message) -> None:
        try:
            await consumer.acknowledge(message)
        except Exception as e:
            ack_errors.append(e)
        finally:
            window.release()

    stored_order(load, result)
    started = time.perf_counter()
    consumer = await client.subscribe(TOPIC, SUBSCRIPTION, initial_position="earliest")
    try:
        while len(seen) < len(expected):
            try:
                message = await consumer.receive(timeout_s=VERIFY_IDLE_S)
            except TimeoutError:
                result.timed_out = True
                break
            result.received += 1
            if message.redelivery_count:
                result.redelivered += 1
            seq = int(message.value[:12])
            if seq not in expected:
                result.unexpected += 1
            elif seq in seen:
                result.duplicates += 1
            else:
                seen.add(seq)
                key = message.key or ""
                last = last_per_key.get(key)
                if last is not None and last[0] > seq:
                    result.out_of_order += 1
                    if last[1].topic != message.message_id.topic:
                        result.across_segments += 1
                    if len(result.examples) < 2 * EXAMPLES:
                        result.examples.append(
                            f"key {key}: send #{seq} ({message.message_id}) received after "
                            f"send #{last[0]} ({last[1]})"
                        )
                if last is None or last[0] < seq:
                    last_per_key[key] = (seq, message.message_id)
            await window.acquire()
            task = asyncio.create_task(ack(consumer, message))
            acks.add(task)
            task.add_done_callback(acks.discard)
        with contextlib.suppress(TimeoutError):  # anything stored beyond what was acked?
            while True:
                message = await consumer.receive(timeout_s=0.5)
                result.received += 1
                seq = int(message.value[:12])
                if seq in seen:
                    result.duplicates += 1
                else:
                    result.unexpected += 1
        await asyncio.gather(*acks)
    finally:
        await consumer.close()
    for error in ack_errors:
        result.ack_errors[repr(error)] = result.ack_errors.get(repr(error), 0) + 1
    result.distinct = len(seen)
    result.missing = len(expected) - len(seen)
    result.elapsed = time.perf_counter() - started
    return result


async def run_all(brokers: list[ServerProcess], seconds: float) -> Results:
    names = {b.url: b.name for b in brokers}
    started = time.perf_counter()
    async with Client(brokers[0].url) as client:
        async with asyncio.timeout(RUN_LIMIT_S):
            results, load = await produce(client, seconds, names)
        print(
            f"  produced: {results.acked:,} sends acknowledged in "
            f"{time.perf_counter() - started:.1f} s",
            flush=True,
        )
        results.verification = await verify(client, load)
        print(f"  verified in {results.verification.elapsed:.1f} s", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--seconds", type=float, default=3.0, help="duration of each steady phase (default 3)"
    )
    args = parser.parse_args(argv)
    seconds: float = args.seconds

    started = time.perf_counter()
    directory = Path(tempfile.mkdtemp(prefix=".bench-ledger-scaling-", dir=REPO))
    try:
        print(
            f"segtxn scaling bench: {os.cpu_count()} CPUs; etcd single member, fsync on; "
            f"{BROKERS} brokers in their own processes, ledgers in {directory}"
        )
        with cluster(directory) as brokers:
            results = asyncio.run(run_all(brokers, seconds))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print()
    print_tables(results, seconds)
    print(f"\ntotal run time: {time.perf_counter() - started:.1f} s")
    return 0 if passed(results) else 1


if __name__ == "__main__":
    sys.exit(main())
