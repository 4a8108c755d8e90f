"""Peer benchmark: the same consume-transform-produce loop against RabbitMQ and segtxn,
alternating in one run, printing segtxn ÷ RabbitMQ and transactional ÷ plain (issue 16).

One loop per run: receive a batch of B messages from an input (100 B each, pre-filled),
send one derived message (same size) per input to an output, acknowledge the inputs, next
batch. Rows (``--plain-sizes``, ``--sizes``):

* ``plain B``: at-least-once. RabbitMQ: publisher confirms, all B awaited together, then
  one ``multiple`` ack. segtxn: the B sends and B acks in flight together, all awaited
  (as ``bench/txn.py`` (c)).
* ``txn B``: one transaction per batch covering the consumed acks and the sends.
  RabbitMQ: AMQP channel transactions (``tx_select`` once, ``tx_commit`` per batch).
  segtxn: NEW_TXN, the B transactional sends and acks in flight together, then commit,
  which waits for them (as ``tx_commit`` covers the publishes before it: neither waits for
  each message on its own); the client pre-starts the next transaction
  (``prestart_transactions``), as RabbitMQ's channel is in its next transaction as soon as
  ``tx_commit`` returns. All of a batch's operations on the one broker, the commit is the
  broker's one-step commit (docs/transactions.md): ``--two-step`` turns it off
  (``Client(one_step_commit=False)``), so END_TXN follows the op records.
* ``txnp B`` (``--pipelined``, segtxn only): as ``txn B``, but each batch's commit runs
  while the next batch is received, transformed and sent, in a transaction that follows
  it (``client.transaction(after=...)``: it starts once the previous one's sends and acks
  are done, and commits only if that one committed). Its segtxn ÷ RabbitMQ is against
  RabbitMQ's ``txn B``: an AMQP channel's ``tx_commit`` ends one transaction before the
  next begins, so RabbitMQ has no such row. Latency is still per batch, to its commit's
  end.

Durable everywhere: RabbitMQ durable classic queues and persistent messages; segtxn
``topic://`` topics of ``--segments`` segments (4: issue 16's and ``bench/txn.py``'s).
segtxn consumes on a Shared subscription by default: a queue's semantics, each message
acknowledged on its own, every ack of a batch in flight together. ``--subscription
Exclusive`` is ``bench/txn.py`` (c)'s; on an ordered subscription the broker refuses a
transactional ack while an earlier message of its segment is still unacknowledged, so acks
in flight together may fail with TransactionConflict: a failed run is reported as FAILED and
the others go on.
Each run uses fresh queues or topics, a fresh connection or Client, and a pre-filled input
sized from the rates seen so far (a run that empties it stops early: the rate still
holds). The first batch is a warm-up; the window runs ``--seconds`` after it. Latency is per
batch: from starting to receive its inputs until its sends and acks (or commit) are done;
``commit ms`` is the commit call (segtxn: with the sends and acks it waits for; RabbitMQ:
``tx_commit``).

segtxn (``--store etcd``, the default: issue 16's setup, ``bench/txn.py`` (c)): a private
single-member etcd (fsync on, on /dev/shm when it exists), one broker and one coordinator,
each its own process. ``--store memory``: one process (this script, ``--serve-standalone``)
running a broker and a coordinator on an in-memory store. RabbitMQ: a private node (see
``peerlib``); without ``rabbitmq-server`` on PATH it says how to install it and runs the
segtxn rows alone. Ledgers and RabbitMQ's data share one temporary ``.bench-peer-*``
directory under the repository (removed at the end).

The clients of both systems run in this process, on the event loop ``--event-loop`` names
(``auto``, the default: uvloop where it is installed, as segtxn's servers; aio-pika runs on
it as well as segtxn's client), and so does ``--store memory``'s server.

Every round runs every row on both systems, in turns (RabbitMQ first in odd rounds, segtxn
first in even ones), so drift in the machine's load hits both. Rates are the median over
rounds with the range; ratios are per round (the same row, side by side), median and
range. CPU per message: user + system seconds of the server (segtxn broker; RabbitMQ's
process tree), of segtxn's coordinator + etcd (``other``), and of this process (the
client), over the window, from ``/proc``. Store writes per message (``--store etcd``): etcd's
own count of committed raft proposals over the window, so every write request of every
segtxn process counts, whatever it wrote.

Run: ``.venv/bin/python bench/peer.py [--seconds S] [--rounds R] [--sizes 1,10,100,1000]
[--plain-sizes 10,100|none] [--store etcd|memory] [--subscription Shared|Exclusive]
[--no-rabbitmq] [--two-step] [--pipelined] [--event-loop auto|uvloop|asyncio]``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from common import (
    ServerProcess,
    collect_as_servers_do,
    exit_on_sigterm,
    file_ledger_broker,
    filesystem_of,
    percentile,
    store_writes,
    until_signalled,
)
from peerlib import (
    INSTALL_HINT,
    RECEIVE_TIMEOUT_S,
    Meter,
    RabbitNode,
    Row,
    Sample,
    payload,
    rabbitmq_node,
    rabbitmq_row,
    rabbitmq_script,
    transform,
)
from peerresults import Plan, ms, print_tables

from segtxn.cli.loops import CHOICES, EventLoop, choose
from segtxn.client import Client, MessageId, Transaction
from segtxn.metastore.etcd_server import EtcdServer, free_port

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "topic://bench/ns"
TXN_TIMEOUT_S = 60.0
ROW_LIMIT_S = 600.0
"""A run that takes longer than this has hung: it fails instead of waiting forever."""
HEADROOM = 2.0
"""Pre-fill this much more than the best rate seen times ``--seconds``."""
MAX_PREFILL = 200_000


# ---------------------------------------------------------------------- segtxn


@dataclass
class Segtxn:
    url: str
    broker_pid: int | None
    other_pids: list[int | None]
    etcd_metrics: str | None
    """etcd's ``/metrics`` (``--store etcd``): its raft proposals count the store writes."""


class StandaloneProcess(ServerProcess):
    """This script with ``--serve-standalone``: a broker and a coordinator in one process
    on a ``memory://`` store, ledgers on disk (``segtxn standalone`` keeps them in memory
    with that store)."""

    def __init__(self, directory: Path, loop: EventLoop) -> None:
        super().__init__("standalone", [], directory / "standalone.log")
        script = str(Path(__file__).resolve())
        ledgers = str(directory / "ledgers")
        self._command = [sys.executable, script, "--serve-standalone", str(self.port), ledgers]
        self._command += ["--event-loop", loop.name]


@contextmanager
def segtxn_cluster(store: str, directory: Path, loop: EventLoop) -> Iterator[Segtxn]:
    servers: list[ServerProcess] = []
    etcd: EtcdServer | None = None
    try:
        if store == "memory":
            servers.append(StandaloneProcess(directory, loop))
        else:
            etcd = EtcdServer.in_temp_dir()
            etcd.start()
            url = etcd.url("/bench")
            ledgers = str(directory / "b1")
            broker = ["broker", "--store", url, "--data-dir", ledgers, "--broker-id", "b1"]
            servers.append(ServerProcess("broker", broker, directory / "broker.log"))
            servers.append(
                ServerProcess(
                    "coordinator", ["coordinator", "--store", url], directory / "coordinator.log"
                )
            )
        for server in servers:
            server.start()
        for server in servers:
            server.wait_ready()
        pids = [s.process.pid if s.process else None for s in servers]
        if etcd is not None and etcd.process is not None:
            pids.append(etcd.process.pid)
        metrics = None if etcd is None else f"http://{etcd.endpoint}/metrics"
        yield Segtxn(servers[0].url, pids[0], pids[1:], metrics)
    finally:
        for server in reversed(servers):
            server.stop()
        if etcd is not None:
            etcd.stop()


async def serve_standalone(port: int, ledger_dir: Path) -> None:
    """``--serve-standalone``: serve until SIGTERM or SIGINT."""
    from segtxn.coordinator.app import CoordinatorServer
    from segtxn.coordinator.settings import CoordinatorSettings

    broker = file_ledger_broker(port, ledger_dir)
    coordinator_port = free_port()
    coordinator = CoordinatorServer(
        CoordinatorSettings(advertise_url=f"http://127.0.0.1:{coordinator_port}"),
        host="127.0.0.1",
        port=coordinator_port,
        store=broker.service.store,
    )
    await broker.start()
    await coordinator.start()
    collect_as_servers_do()
    try:
        await until_signalled()
    finally:
        await coordinator.stop()
        await broker.stop()


async def fill(client: Client, topic: str, count: int) -> None:
    """Pre-fill ``topic`` with ``count`` messages, all in flight together, and let their
    futures go. A row that kept them (about 125,000 futures and ids) alive through its
    window paid for them in every full collection of the garbage collector, which walks
    every live object: up to 260 ms each, the rows of 100 at a p99 of 198-237 ms and 102-143
    µs of client CPU per message, against 50-53 ms and 72-90 µs once they are let go (one
    run each, a ``gc.callbacks`` timer in this process). RabbitMQ's pre-fill never held
    them."""
    filler = await client.create_producer(topic)
    sent: list[asyncio.Future[MessageId]] = []
    try:
        for i in range(count):
            sent.append(await filler.send_async(payload(i), key=f"k{i}"))
        await asyncio.gather(*sent)
    finally:  # interrupted (Ctrl-C): the sends in flight are let go, not each logged as failed
        for future in sent:
            future.cancel()
    await filler.close()


async def segtxn_row(cluster: Segtxn, name: str, row: Row, prefill: int, plan: Plan) -> Sample:
    """The loop of ``bench/txn.py`` (c) on fresh topics ``name-in`` / ``name-out``."""
    sample = Sample("segtxn", row)
    source, sink = f"{NAMESPACE}/{name}-in", f"{NAMESPACE}/{name}-out"
    async with Client(
        cluster.url, prestart_transactions=True, one_step_commit=not row.two_step
    ) as client:
        await client.admin.create_topic(source, segments=plan.segments)
        await client.admin.create_topic(sink, segments=plan.segments)
        await fill(client, source, prefill)
        consumer = await client.subscribe(
            source, "bench", initial_position="earliest", subscription_type=plan.sub_type
        )
        outputs = await client.create_producer(sink)
        meter: Meter | None = None
        consumed, start, writes = 0, 0.0, 0
        previous: Transaction | None = None  # (pipelined: the last batch's, committing)
        in_flight: asyncio.Task[None] | None = None  # (pipelined: its commit)
        while consumed + row.size <= prefill:
            t0 = time.perf_counter()
            inputs = [await consumer.receive(RECEIVE_TIMEOUT_S) for _ in range(row.size)]
            txn = None
            if row.transactional:
                txn = await client.transaction(timeout_s=TXN_TIMEOUT_S, after=previous).start()
            sends = [
                await outputs.send_async(transform(m.value), key=m.key, txn=txn) for m in inputs
            ]
            acks = [await consumer.acknowledge_async(m, txn=txn) for m in inputs]
            committing = time.perf_counter()
            if txn is None:
                await asyncio.gather(*sends, *acks)
            elif not row.pipelined:  # the commit waits for them (as tx_commit covers
                await txn.commit()  # RabbitMQ's publishes)
            else:  # this batch commits while the next is worked on; the last one's is done
                commit = asyncio.create_task(txn.commit())
                if meter is not None:  # (timed when it ends: not a warm-up batch)
                    commit.add_done_callback(functools.partial(timed, sample, t0, committing))
                if in_flight is not None:
                    await in_flight
                in_flight, previous = commit, txn
            now = time.perf_counter()
            consumed += row.size
            if meter is None:  # the warm-up batch ends: the window starts
                writes = await asyncio.to_thread(store_writes, cluster.etcd_metrics)
                meter = Meter(cluster.broker_pid, cluster.other_pids)
                start = time.perf_counter()
                continue
            if not row.pipelined:
                sample.latencies.append(now - t0)
                if txn is not None:
                    sample.commits.append(now - committing)
            sample.messages += row.size
            if now - start >= plan.seconds:
                break
        else:
            sample.ran_out = True
        if in_flight is not None:
            await in_flight  # (its messages are counted: the window ends with it)
        sample.elapsed = time.perf_counter() - start
        if meter is not None:
            meter.stop(sample)
            end = await asyncio.to_thread(store_writes, cluster.etcd_metrics)
            sample.store_writes = end - writes
        await consumer.close()
    return sample


def timed(sample: Sample, t0: float, committing: float, commit: asyncio.Task[None]) -> None:
    """A pipelined batch's commit ended: its latency (from receiving its first input) and
    its commit call's time, if it committed (a failure is raised where it is awaited)."""
    if not commit.cancelled() and commit.exception() is None:
        now = time.perf_counter()
        sample.latencies.append(now - t0)
        sample.commits.append(now - committing)


# ---------------------------------------------------------------------- driver


def prefill_for(row: Row, rate: float, seconds: float) -> int:
    batches = math.ceil(rate * seconds * HEADROOM / row.size) + 1  # + the warm-up batch
    return min(MAX_PREFILL, max(3, batches) * row.size)


def first_guess(row: Row) -> float:
    """msg/s to size the first round's input (later rounds use the best rate seen)."""
    return 3000.0 if not row.transactional else min(3000.0, 600.0 * row.size)


async def run_rounds(plan: Plan, segtxn: Segtxn, rabbit: RabbitNode | None) -> list[Sample]:
    systems = ["RabbitMQ", "segtxn"] if rabbit is not None else ["segtxn"]
    best: dict[tuple[str, Row], float] = {}
    samples: list[Sample] = []
    for r in range(plan.rounds):
        for i, row in enumerate(plan.rows):
            order = systems if r % 2 == 0 else systems[::-1]
            for system in ["segtxn"] if row.segtxn_only else order:
                rate = best.get((system, row), first_guess(row))
                prefill = prefill_for(row, rate, plan.seconds)
                name = f"peer-r{r}-{i}"
                try:
                    async with asyncio.timeout(ROW_LIMIT_S):
                        if system == "RabbitMQ":
                            assert rabbit is not None
                            s = await rabbitmq_row(rabbit, name, row, prefill, plan.seconds)
                        else:
                            s = await segtxn_row(segtxn, name, row, prefill, plan)
                except Exception as e:  # refused or hung: say so, and run the rest
                    s = Sample(system, row, error=f"{type(e).__name__}: {e}")
                s.round = r
                samples.append(s)
                if s.error is not None:
                    print(f"  round {r + 1} {row.label:>9} {system:>8}: FAILED {s.error}")
                    continue
                best[(system, row)] = max(best.get((system, row), 0.0), s.rate)
                print(
                    f"  round {r + 1} {row.label:>9} {system:>8}: {s.rate:8,.0f} msg/s, "
                    f"p50 {ms(percentile(s.latencies, 50))} p99 {ms(percentile(s.latencies, 99))}"
                    f" ms, {len(s.latencies)} batches{' (input ran out)' if s.ran_out else ''}",
                    flush=True,
                )
    return samples


# ---------------------------------------------------------------------- output


# ---------------------------------------------------------------------- main


def sizes(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"not a list of positive sizes: {text!r}")
    return values


def plain_sizes(text: str) -> list[int]:
    """``none``: no plain rows (the transactional ones alone, e.g. under a profiler)."""
    return [] if text.strip().lower() == "none" else sizes(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=5.0, help="window per run (5)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over every row (3)")
    parser.add_argument(
        "--sizes", type=sizes, default=[1, 10, 100, 1000], help="messages per txn (1,10,100,1000)"
    )
    parser.add_argument(
        "--plain-sizes",
        type=plain_sizes,
        default=[10, 100],
        help="messages per plain batch (10,100; none: no plain rows)",
    )
    parser.add_argument("--store", choices=("etcd", "memory"), default="etcd")
    parser.add_argument("--segments", type=int, default=4, help="segments per segtxn topic (4)")
    parser.add_argument(
        "--subscription",
        choices=("Shared", "Exclusive", "Failover"),
        default="Shared",
        help="segtxn subscription type (Shared: a RabbitMQ queue's semantics)",
    )
    parser.add_argument("--no-rabbitmq", action="store_true", help="the segtxn rows alone")
    parser.add_argument(
        "--two-step",
        action="store_true",
        help="also a txn2 row per size: END_TXN after the op records (no one-step commit)",
    )
    parser.add_argument(
        "--pipelined",
        action="store_true",
        help="also a txnp row per size: each batch commits while the next is worked on "
        "(client.transaction(after=...)); its segtxn ÷ RabbitMQ is against RabbitMQ's txn row",
    )
    parser.add_argument(
        "--event-loop",
        choices=CHOICES,
        default="auto",
        help="the event loop of the clients (this process: both systems' in turn) and of "
        "--store memory's server (default auto: uvloop where installed, as segtxn's servers)",
    )
    parser.add_argument(
        "--serve-standalone", nargs=2, metavar=("PORT", "DIR"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    loop = choose(args.event_loop)
    if args.serve_standalone:
        port, ledgers = args.serve_standalone
        with asyncio.Runner(loop_factory=loop.factory) as runner:
            runner.run(serve_standalone(int(port), Path(ledgers)))
        return 0
    exit_on_sigterm()
    rows = [Row(False, s) for s in args.plain_sizes] + [Row(True, s) for s in args.sizes]
    rows += [Row(True, s, two_step=True) for s in args.sizes if args.two_step]
    rows += [Row(True, s, pipelined=True) for s in args.sizes if args.pipelined]
    plan = Plan(rows, args.rounds, args.seconds, args.segments, args.subscription, args.store)
    script = None if args.no_rabbitmq else rabbitmq_script()
    if script is None and not args.no_rabbitmq:
        print(INSTALL_HINT)
    started = time.perf_counter()
    directory = Path(tempfile.mkdtemp(prefix=".bench-peer-", dir=REPO))
    try:
        with ExitStack() as stack:
            segtxn = stack.enter_context(segtxn_cluster(args.store, directory, loop))
            rabbit = None
            if script is not None:
                rabbit = stack.enter_context(rabbitmq_node(script, directory / "rabbitmq"))
            print(
                f"peer bench: segtxn ({args.store} store, {args.segments}-segment topics) vs "
                f"{f'RabbitMQ ({script})' if rabbit else 'no RabbitMQ'}; clients on the "
                f"{loop.name} event loop; data in {directory} "
                f"({filesystem_of(directory)}); rows: {', '.join(r.label for r in rows)}",
                flush=True,
            )
            with asyncio.Runner(loop_factory=loop.factory) as runner:
                samples = runner.run(run_rounds(plan, segtxn, rabbit))
    except KeyboardInterrupt:
        print("\ninterrupted: the servers are stopped")
        return 130
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print_tables(plan, samples)
    print(f"\ntotal run time: {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
