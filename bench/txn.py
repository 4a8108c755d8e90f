"""Transaction benchmark: END_TXN latency, commit-to-visible latency, transactional
consume-transform-produce throughput, on a real cluster with etcd as the metadata store.

The script starts a private single-member etcd (``EtcdServer.in_temp_dir()``: data on
``/dev/shm`` when it exists, fsync on), one broker and one v5 coordinator, each as a
**separate process** (``python -m segtxn.cli broker|coordinator``), so this process's event
loop (all the clients) does not share a process with them. Broker ledgers go to a temporary
``.bench-ledger-txn-*`` directory under the repository (removed at the end). All clients go
through the public :class:`~segtxn.client.Client`.

It measures:

(a) **END_TXN latency** with 1, 8 and 64 participant segments: each transaction writes
    exactly one message to each of N distinct segments of an N-segment ``topic://`` (64:
    two 32-segment topics, see ``MAX_SEGMENTS_PER_TOPIC``; one key per segment, chosen
    with ``ScalableProducer.route``); once every send is durable the timer covers
    ``commit()`` alone. p50/p99 per N, and the 64/1 ratios. PIP-471 says this stays flat:
    END_TXN is one CAS of the header (the coordinator never calls a participant). A second
    block of as many transactions waits ``IDLE_S`` (50 ms) before each commit: with equal
    idle before every commit the ratio is END_TXN's own; back to back it also counts how
    much longer the processes sat idle during the 64 sends (``txnresults.IDLE_S`` says
    why that matters on a virtual machine). The
    ``sends`` column is the time from NEW_TXN's return until the N sends (all in flight
    together) are durable, for comparison, and ``sends ÷ N`` that per segment: each
    transactional send is a ledger append plus the write of its transaction's writes
    record for that segment (one etcd step with the others in flight).
(b) **commit-to-visible latency** on 8 segments: a consumer subscribed before the
    transactions; a sample is the time from ``commit()`` returning (and from its start)
    until the consumer has received all 8 messages of that transaction (it never
    acknowledges: acks are not measured here). Participants learn the outcome from their
    watch on the transaction headers, then let the dispatcher go. PIP-471 says "tens of
    ms".
(c) **consume-transform-produce throughput**: an input topic (4 segments) pre-filled with
    M messages, one processor loop that receives a batch of B messages (B = 10, 100), sends
    one derived message per input to an output topic (4 segments) and acknowledges every
    input, then the next batch. ``txn``: the sends and acks are made in one transaction per
    batch, committed at the end of the batch; ``plain``: the same loop without
    transactions (outputs sent, then inputs acknowledged, both awaited before the next
    batch). In both, a batch's sends and acks are in flight together. Fresh topics and
    subscriptions per run. The figure is txn msgs/s over plain msgs/s for the same B. The
    client pre-starts transactions (``Client(prestart_transactions=True)``).

What (c) costs the store: per transaction, NEW_TXN (one etcd step) and END_TXN (a read and a
CAS); on the broker, one writes record per output segment and one acks record per input
segment, each rewritten when more sends or acks arrive while its last write was in flight
(several records of one transaction share one etcd step: ``segtxn/broker/txn/oprecords.py``);
after the outcome, the abort index and watermark (one step) and the records' deletes (one
step). ``store writes/txn`` is etcd's own count of committed write requests during the run
(its ``etcd_server_proposals_committed_total``) per transaction (plain: per batch).

Each measurement uses its own :class:`~segtxn.client.Client` (fresh connections).

All latency figures are nearest-rank percentiles. The machine's cores are shared by etcd,
the broker, the coordinator and this process, so read the numbers as ratios from one run.

Run: ``.venv/bin/python bench/txn.py [--quick] [--count N] [--messages M]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from common import ServerProcess, exit_on_sigterm, store_writes
from txnresults import (
    CTP_SEGMENTS,
    IDLE_S,
    VISIBLE_SEGMENTS,
    Counts,
    EndTxnResult,
    PipelineResult,
    Results,
    VisibleResult,
    print_tables,
)

from segtxn.client import Client, Consumer, Message, MessageId, ScalableProducer, Transaction
from segtxn.metastore.etcd_server import EtcdServer

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "topic://bench/ns"
SEGMENT_COUNTS = (1, 8, 64)
MAX_SEGMENTS_PER_TOPIC = 32
"""Creating a ``topic://`` with 64 segments fails (HTTP 500, TooManyOperations: the
catalog writes the topic record and each segment's home record with its index entry in one
atomic step, 2 * 64 + 1 = 129 physical operations > 128), so 64 participant segments are
two 32-segment topics in one transaction."""
CTP_BATCHES = (10, 100)
WARMUP_TXNS = 3
RECEIVE_TIMEOUT_S = 10.0
TXN_TIMEOUT_S = 60.0
SECTION_LIMIT_S = 300.0
"""A measurement that takes longer than this has hung: it fails instead of waiting forever."""
SUBSCRIPTION = "bench"


# ---------------------------------------------------------------------- the cluster


@dataclass
class Cluster:
    broker_url: str
    store_url: str
    etcd: EtcdServer


@contextlib.contextmanager
def cluster(directory: Path) -> Iterator[Cluster]:
    """A private etcd (fsync on), one broker and one coordinator; stopped at the end."""
    etcd = EtcdServer.in_temp_dir()
    etcd.start()
    servers: list[ServerProcess] = []
    try:
        store = etcd.url("/bench")
        broker = ServerProcess(
            "broker",
            ["broker", "--store", store, "--data-dir", str(directory / "b1"), "--broker-id", "b1"],
            directory / "broker.log",
        )
        coordinator = ServerProcess(
            "coordinator", ["coordinator", "--store", store], directory / "coordinator.log"
        )
        servers += [broker, coordinator]
        for server in servers:
            server.start()
        for server in servers:
            server.wait_ready()
        yield Cluster(broker.url, store, etcd)
    finally:
        for server in reversed(servers):
            server.stop()
        etcd.stop()


# ---------------------------------------------------------------------- helpers


def keys_per_segment(producer: ScalableProducer, segments: int) -> list[str]:
    """One key routed to each active segment (in segment-id order)."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < segments:
        key = f"k{i}"
        found.setdefault(producer.route(key), key)
        i += 1
        if i > 1_000_000:
            raise RuntimeError(f"no key found for some of {segments} segments")
    return [found[s] for s in sorted(found)]


async def scalable_producer(client: Client, topic: str) -> ScalableProducer:
    producer = await client.create_producer(topic)
    assert isinstance(producer, ScalableProducer)
    return producer


async def send_all(
    producer: ScalableProducer,
    values: list[tuple[bytes, str | None]],
    txn: Transaction | None = None,
) -> None:
    """Queue every send, then wait until all are durable."""
    futures: list[asyncio.Future[MessageId]] = []
    for value, key in values:
        futures.append(await producer.send_async(value, key=key, txn=txn))
    await asyncio.gather(*futures)


# ---------------------------------------------------------------------- (a) END_TXN


async def end_txn_latency(client: Client, segments: int, count: int) -> EndTxnResult:
    """``count`` transactions (after a warm-up), each one message to each of ``segments``
    segments spread over ceil(segments / MAX_SEGMENTS_PER_TOPIC) topics."""
    topics = math.ceil(segments / MAX_SEGMENTS_PER_TOPIC)
    targets: list[tuple[ScalableProducer, list[str]]] = []
    for t in range(topics):
        per_topic = segments // topics + (1 if t < segments % topics else 0)
        topic = f"{NAMESPACE}/endtxn-{segments}-{t}"
        await client.admin.create_topic(topic, segments=per_topic)
        producer = await scalable_producer(client, topic)
        targets.append((producer, keys_per_segment(producer, per_topic)))
    result = EndTxnResult(segments, [], [], [])
    for idle in (False, True):  # in blocks: an idle commit would cool the next one
        for i in range(WARMUP_TXNS + count):
            txn = await client.transaction(timeout_s=TXN_TIMEOUT_S).start()
            t0 = time.perf_counter()
            await asyncio.gather(
                *(send_all(p, [(f"{i}".encode(), k) for k in keys], txn) for p, keys in targets)
            )
            t1 = time.perf_counter()
            if idle:
                await asyncio.sleep(IDLE_S)  # what is measured: a commit after this idle
            t2 = time.perf_counter()
            await txn.commit()
            t3 = time.perf_counter()
            if i >= WARMUP_TXNS:
                (result.commit_after_idle if idle else result.commit).append(t3 - t2)
                if not idle:
                    result.sends.append(t1 - t0)
    return result


# ---------------------------------------------------------------------- (b) visibility


async def commit_to_visible(client: Client, count: int) -> VisibleResult:
    topic = f"{NAMESPACE}/visible"
    await client.admin.create_topic(topic, segments=VISIBLE_SEGMENTS)
    consumer = await client.subscribe(topic, SUBSCRIPTION, initial_position="latest")
    producer = await scalable_producer(client, topic)
    keys = keys_per_segment(producer, VISIBLE_SEGMENTS)
    result = VisibleResult([], [], [])
    for i in range(WARMUP_TXNS + count):
        txn = await client.transaction(timeout_s=TXN_TIMEOUT_S).start()
        expected = {f"{i}/{k}".encode() for k in keys}
        await send_all(producer, [(f"{i}/{k}".encode(), k) for k in keys], txn)
        t0 = time.perf_counter()
        await txn.commit()
        t1 = time.perf_counter()
        while expected:
            message = await consumer.receive(timeout_s=RECEIVE_TIMEOUT_S)
            if message.value not in expected:
                raise RuntimeError(f"txn {i}: unexpected message {message.value!r}")
            expected.discard(message.value)
        t2 = time.perf_counter()
        if i >= WARMUP_TXNS:
            result.commit.append(t1 - t0)
            result.from_return.append(t2 - t1)
            result.from_start.append(t2 - t0)
    return result


# ---------------------------------------------------------------------- (c) pipeline


async def pipeline(
    client: Client, run: int, batch: int, messages: int, *, transactional: bool, metrics: str
) -> PipelineResult:
    source = f"{NAMESPACE}/ctp-in-{run}"
    sink = f"{NAMESPACE}/ctp-out-{run}"
    await client.admin.create_topic(source, segments=CTP_SEGMENTS)
    await client.admin.create_topic(sink, segments=CTP_SEGMENTS)
    filler = await scalable_producer(client, source)
    await send_all(filler, [(f"in-{j}".encode(), f"k{j}") for j in range(messages)])
    consumer: Consumer = await client.subscribe(source, SUBSCRIPTION, initial_position="earliest")
    outputs = await scalable_producer(client, sink)
    result = PipelineResult(transactional, batch, messages, 0.0, 0)
    done = 0
    writes = await asyncio.to_thread(store_writes, metrics)
    start = time.perf_counter()
    while done < messages:
        inputs: list[Message] = [
            await consumer.receive(timeout_s=RECEIVE_TIMEOUT_S)
            for _ in range(min(batch, messages - done))
        ]
        if transactional:
            t0 = time.perf_counter()
            txn = await client.transaction(timeout_s=TXN_TIMEOUT_S).start()
            t1 = time.perf_counter()
            sends = [
                await outputs.send_async(m.value + b"-out", key=m.key, txn=txn) for m in inputs
            ]
            acks = [await consumer.acknowledge_async(m, txn=txn) for m in inputs]
            await asyncio.gather(*sends, *acks)
            t2 = time.perf_counter()
            await txn.commit()
            t3 = time.perf_counter()
            result.new_txn.append(t1 - t0)
            result.ops_phase.append(t2 - t1)
            result.commit.append(t3 - t2)
        else:
            t1 = time.perf_counter()
            sends = [await outputs.send_async(m.value + b"-out", key=m.key) for m in inputs]
            acks = [asyncio.ensure_future(consumer.acknowledge(m)) for m in inputs]
            await asyncio.gather(*sends, *acks)
            result.ops_phase.append(time.perf_counter() - t1)
        done += len(inputs)
        result.batches += 1
    result.elapsed = time.perf_counter() - start
    result.store_writes = await asyncio.to_thread(store_writes, metrics) - writes
    await consumer.close()
    return result


# ---------------------------------------------------------------------- reference


# ---------------------------------------------------------------------- driver


async def run_all(c: Cluster, counts: Counts) -> Results:
    """Every measurement, each with its own Client (see ``SECTION_LIMIT_S`` and the client's
    connection pool note in the module docstring) and a time limit, so a hang is an error."""
    results = Results()
    for n in SEGMENT_COUNTS:
        started = time.perf_counter()
        async with asyncio.timeout(SECTION_LIMIT_S), Client(c.broker_url) as client:
            results.end_txn.append(await end_txn_latency(client, n, counts.end_txn))
        print(f"  (a) {n} segments: {time.perf_counter() - started:.1f} s", flush=True)
    started = time.perf_counter()
    async with asyncio.timeout(SECTION_LIMIT_S), Client(c.broker_url) as client:
        results.visible = await commit_to_visible(client, counts.visible)
    print(f"  (b) commit-to-visible: {time.perf_counter() - started:.1f} s", flush=True)
    run = 0
    for batch in CTP_BATCHES:
        for transactional in (False, True):
            run += 1
            async with (
                asyncio.timeout(SECTION_LIMIT_S),
                Client(c.broker_url, prestart_transactions=True) as client,
            ):
                r = await pipeline(
                    client,
                    run,
                    batch,
                    counts.messages,
                    transactional=transactional,
                    metrics=f"http://{c.etcd.endpoint}/metrics",
                )
            results.pipelines.append(r)
            mode = "txn" if transactional else "plain"
            print(f"  (c) {mode}, batch {batch}: {r.elapsed:.1f} s", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smaller counts (a smoke run)")
    parser.add_argument(
        "--count",
        type=int,
        default=None,
        help="transactions per row in (a) and (b) (default 100; 20 with --quick)",
    )
    parser.add_argument(
        "--messages",
        type=int,
        default=None,
        help="messages per consume-transform-produce run (default 3000; 400 with --quick)",
    )
    args = parser.parse_args(argv)
    count = args.count or (20 if args.quick else 100)
    counts = Counts(
        end_txn=count,
        visible=count,
        messages=args.messages or (400 if args.quick else 3000),
    )

    started = time.perf_counter()
    directory = Path(tempfile.mkdtemp(prefix=".bench-ledger-txn-", dir=REPO))
    try:
        print(
            f"segtxn transaction bench: {os.cpu_count()} CPUs; etcd single member, fsync on; "
            f"broker and coordinator in their own processes, ledgers in {directory}"
        )
        with cluster(directory) as c:
            print(f"etcd data in {c.etcd.data_dir}")
            results = asyncio.run(run_all(c, counts))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print()
    print_tables(results, counts)
    print(f"\ntotal run time: {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
