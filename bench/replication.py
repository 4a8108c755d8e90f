"""Replication benchmark (issue 17): what ``--replication 3/2`` costs a producer, and how
long a topic is out of service after its broker is SIGKILLed.

The script starts a private single-member etcd (``EtcdServer.in_temp_dir()``: data on
``/dev/shm`` when it exists, fsync on) and on it **two clusters of three brokers**, each
broker its own process (``python -m segtxn.cli broker``), each cluster under its own
namespace of the store:

* ``unreplicated``: no ``--replication``: each ledger in its owner's files only;
* ``replicated 3/2``: every broker is also a storage node; a new ledger goes to 3 brokers
  (its owner first) and an entry is acknowledged once 2 of them have synced it.

Each cluster also has a transaction coordinator process. The brokers run with
``--session-ttl`` (default 2 s). Every broker's files go to a temporary
``.bench-ledger-replication-*`` directory under the repository (the repository's disk,
never tmpfs; removed at the end). All clients run in this process, through the public
:class:`~segtxn.client.Client`.

**1. Produce throughput and send latency, side by side.** In each of ``--rounds`` rounds,
each load runs on both clusters in turns (unreplicated first in odd rounds, replicated
first in even ones), each time on a fresh ``persistent://`` topic with ``--producers``
producers on it (one topic: one owner, one ledger, and in the replicated cluster its two
replicas on the other brokers), ``--size`` B messages:

* ``one at a time``: each producer sends a message and waits for its receipt before the
  next (one in flight per producer);
* ``pipelined``: each producer keeps up to ``IN_FLIGHT`` messages in flight
  (``send_async``), batching on (messages queued while a frame is written travel in one
  ``SendBatch`` frame).

A message counts when its receipt (stored: fsynced on its owner's disk, or synced by 2 of
its 3 replicas) arrives inside the window (``--seconds`` after a warm-up). Its latency runs
from the ``send_async`` call to the receipt, for messages sent inside the window; pipelined,
that includes waiting for room in the window, so it is mostly queueing (in flight ÷ rate).
msgs/s and p50/p99 pool every round; the ``replicated ÷ unreplicated`` line gives the
ratios: throughput below 1x and latency above 1x is what replication costs (the range is
the throughput ratio's, round by round).

Then, once per round and in turns too, ``bench/txn.py``'s transactional
**consume-transform-produce** loop ((c) there: a 4-segment ``topic://`` pre-filled with
``--ctp-messages`` messages, ``CTP_BATCH`` received, transformed, sent to another
4-segment topic and acknowledged per transaction, committed; each cluster has a
coordinator for it): msgs/s on each cluster and the ratio.

**2. Take-over after a SIGKILL**, on the replicated cluster, ``--trials`` trials, each on
a fresh topic (created with all three brokers up, so its ledger is on all three). In each,
a client that knows only the two brokers that do not own the topic (lookups go through
them; producers and consumers connect to whichever broker owns it) creates a subscription
(at ``latest``) and a producer that sends ``RATE`` msgs/s on a fixed schedule without
waiting for receipts (sends queue up while the topic has no owner and go again after the
reconnect; de-duplication keeps each once). Once ``PRE_KILL_S`` worth of its sends are
acknowledged, right after a send (so one is in flight), the owner is SIGKILLed (t = 0):

* ``first ack``: until the first receipt of a message sent after the kill;
* ``read back``: until a consumer on that subscription, attached after the kill, has
  received every message acknowledged before the kill (the new owner has recovered the
  ledger and the subscription);
* ``take-over``: the later of the two.

Then the producer stops and flushes, and the killed broker is started again on its own data
directory (ready: registered again); the topic stays with its new home (printed). A
take-over is: the session TTL (the dead broker stays registered that long, and the topic
moves on the first lookup after that), the client's retry back-off (doubling up to 1 s for
lookups, 2 s for a producer's reconnect), and the new owner's recovery of the ledger
(fencing its replicas). After the last trial, an end marker is sent to each trial's topic
and a fresh subscription reads it from ``earliest`` up to the marker: every acknowledged
message must be there exactly once, each producer's messages in the order sent, and a send
whose outcome is unknown at most once. Otherwise the script prints what is wrong, keeps the
brokers' logs and files, and exits 1.

``--same-topic`` runs every trial on one topic instead, killing its home of the moment.
It fails at the second trial: the first take-over happens with one broker down, so the new
owner's ledger is created on two brokers only (``ReplicatedLogStorage``: "with fewer nodes
alive it goes on as many as there are"), and it stays on two after the third broker
returns (no ensemble change; a ledger rolls over at 64 MiB). Killing its owner then leaves
one replica, and recovery needs the ack quorum (2) to hold every entry, so no broker can
load the topic until the killed one is back: the trial waits ``6 x TTL + 30`` s and fails.

Percentiles are nearest-rank; over 5 trials the p99 is the slowest trial. etcd, six
brokers, two coordinators and this process share the machine's cores (two where this was
written), so read the ratios from one run, not the absolute figures.

Run: ``.venv/bin/python bench/replication.py [--seconds S] [--rounds R] [--producers P]
[--size B] [--ctp-messages M] [--trials N] [--session-ttl S] [--same-topic]`` (defaults:
3 s windows, 2 rounds, 4 producers, 100 B, 2000 messages, 5 trials, 2 s TTL: about 1.5
minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from common import ServerProcess, exit_on_sigterm, filesystem_of, percentile, print_rows
from txn import pipeline
from txnresults import PipelineResult

from segtxn.client import Client, MessageId, Producer
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.protocol.names import TopicName

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "persistent://bench/replication"
BROKERS = 3
REPLICATION = "3/2"
IN_FLIGHT = 256
"""Messages in flight per producer, pipelined."""
WARMUP_S = 0.5
RATE = 200.0
"""msgs/s of the take-over trials' producer."""
PRE_KILL_S = 1.0
"""The trial's producer gets this long's worth of receipts before the kill."""
VERIFY_IDLE_S = 20.0
"""The final read receiving nothing this long before the end marker: it fails."""
ONE_AT_A_TIME = "one at a time"
PIPELINED = "pipelined"
MODES = (ONE_AT_A_TIME, PIPELINED)
CTP_BATCH = 100
"""Messages per transaction in the consume-transform-produce loop."""
END = b"end of the take-over trials"


@dataclass(frozen=True)
class Settings:
    seconds: float
    rounds: int
    producers: int
    size: int
    trials: int
    session_ttl_s: float
    ctp_messages: int = 2000
    """Messages per transactional consume-transform-produce run (0: none)."""
    same_topic: bool = False
    """Every trial on one topic (its home after the last trial's kill), not a fresh one."""

    @property
    def takeover_limit_s(self) -> float:
        """A take-over (or a client call during one) taking longer than this has failed."""
        return 6 * self.session_ttl_s + 30


# ---------------------------------------------------------------------- the clusters


@dataclass
class Cluster:
    name: str
    brokers: list[ServerProcess]
    metrics_url: str
    """etcd's ``/metrics`` (``bench/txn.py``'s loop counts the store's writes)."""

    @property
    def urls(self) -> list[str]:
        return [b.url for b in self.brokers]

    def by_url(self, url: str) -> ServerProcess:
        for broker in self.brokers:
            if broker.url == url:
                return broker
        raise RuntimeError(f"{url} is no broker of the {self.name} cluster")


@contextlib.contextmanager
def clusters(directory: Path, session_ttl_s: float) -> Iterator[tuple[Cluster, Cluster]]:
    """A private etcd (fsync on) and two clusters of three brokers and a transaction
    coordinator on it: unreplicated and replicated 3/2; all stopped at the end."""
    etcd = EtcdServer.in_temp_dir()
    etcd.start()
    started: list[ServerProcess] = []
    try:
        made: list[Cluster] = []
        for name, tag, extra in (
            ("unreplicated", "r1", []),
            (f"replicated {REPLICATION}", "r3", ["--replication", REPLICATION]),
        ):
            brokers = []
            for i in range(BROKERS):
                command = ["broker", "--store", etcd.url(f"/{tag}"), "--broker-id", f"b{i}"]
                command += ["--data-dir", str(directory / tag / f"b{i}")]
                command += ["--session-ttl", f"{session_ttl_s:g}", *extra]
                brokers.append(ServerProcess(f"{tag}-b{i}", command, directory / f"{tag}-b{i}.log"))
            coordinator = ["coordinator", "--store", etcd.url(f"/{tag}")]
            made.append(Cluster(name, brokers, f"http://{etcd.endpoint}/metrics"))
            started += [
                *brokers,
                ServerProcess(f"{tag}-c", coordinator, directory / f"{tag}-c.log"),
            ]
        for broker in started:
            broker.start()
        for broker in started:
            broker.wait_ready()
        yield made[0], made[1]
    finally:
        for broker in reversed(started):
            broker.stop()
        etcd.stop()


async def new_producer(
    client: Client,
    topic: str,
    name: str,
    *,
    batching: bool = True,
    max_pending: int = 1000,
    send_timeout_s: float = 30.0,
) -> Producer:
    producer = await client.create_producer(
        topic,
        name=name,
        batching=batching,
        max_pending=max_pending,
        send_timeout_s=send_timeout_s,
    )
    if not isinstance(producer, Producer):
        raise TypeError(f"{topic} is not a persistent:// topic")
    return producer


async def owner_of(urls: list[str], topic: str) -> str:
    async with Client(urls) as client:
        url: str = await client.connector.broker_for(TopicName.parse(topic))
        return url


# ---------------------------------------------------------------------- 1. produce load


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
        failures: list[BaseException] = []

        def settled(sent: float) -> Callable[[asyncio.Future[MessageId]], None]:
            def done(future: asyncio.Future[MessageId]) -> None:
                nonlocal acked
                if future.cancelled():
                    return
                error = future.exception()
                if error is not None:
                    failures.append(error)
                    return
                now = time.perf_counter()
                if start <= now < end:
                    acked += 1
                if start <= sent < end:
                    latencies.append(now - sent)

            return done

        async def pump(sender: Producer) -> None:
            while time.perf_counter() < end:
                sent = time.perf_counter()
                future = await sender.send_async(payload)
                future.add_done_callback(settled(sent))
                if not pipelined:
                    await future

        async with asyncio.TaskGroup() as tg:
            for i, sender in enumerate(senders):
                tg.create_task(pump(sender), name=f"pump-{tag}-{i}")
        for sender in senders:
            await sender.flush()
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


# ---------------------------------------------------------------------- 2. take-over


@dataclass
class Sent:
    payload: bytes
    started: float
    acked: float | None = None
    error: BaseException | None = None


class Prober:
    """One producer sending ``RATE`` msgs/s on a schedule, never waiting for receipts; it
    records every send, and notices the first receipt of a message sent after the kill."""

    def __init__(self, producer: Producer, name: str, size: int) -> None:
        self.producer = producer
        self.name = name
        self.size = size
        self.sends: list[Sent] = []
        self.acked = 0
        self.killed_at = float("inf")
        self.first_ack_after_kill: float | None = None
        self.warmed_up = asyncio.Event()
        """Set right after a send, once ``PRE_KILL_S`` worth of sends are acknowledged."""
        self.answered = asyncio.Event()
        self._stop = asyncio.Event()

    def payload(self, seq: int) -> bytes:
        head = f"{self.name}:{seq:08d}:".encode()
        return head + b"." * max(0, self.size - len(head))

    def stop(self) -> None:
        self._stop.set()

    def _settled(self, sent: Sent) -> Callable[[asyncio.Future[MessageId]], None]:
        def done(future: asyncio.Future[MessageId]) -> None:
            if future.cancelled():
                return
            sent.error = future.exception()
            if sent.error is not None:
                return
            sent.acked = time.perf_counter()
            self.acked += 1
            if sent.started > self.killed_at and self.first_ack_after_kill is None:
                self.first_ack_after_kill = sent.acked
                self.answered.set()

        return done

    async def run(self) -> None:
        begin = time.perf_counter()
        seq = 0
        while not self._stop.is_set():
            # the schedule: the next send is due at begin + seq / RATE (or at once on stop)
            with contextlib.suppress(TimeoutError):
                loop = asyncio.get_running_loop()
                due = loop.time() + max(0.0, begin + seq / RATE - time.perf_counter())
                async with asyncio.timeout_at(due):
                    await self._stop.wait()
            if self._stop.is_set():
                return
            sent = Sent(self.payload(seq), time.perf_counter())
            self.sends.append(sent)
            future = await self.producer.send_async(sent.payload)
            future.add_done_callback(self._settled(sent))
            seq += 1
            if self.acked >= RATE * PRE_KILL_S:
                self.warmed_up.set()  # the kill comes with this message in flight


@dataclass
class Trial:
    number: int
    topic: str
    victim: str
    acked_before: int
    unanswered_at_kill: int
    first_ack_s: float
    read_back_s: float
    home_after: str
    sends: list[Sent] = field(repr=False)

    @property
    def takeover_s(self) -> float:
        return max(self.first_ack_s, self.read_back_s)


async def read_back(client: Client, topic: str, subscription: str, wanted: set[bytes]) -> float:
    """Attach to ``subscription``; when every message of ``wanted`` has arrived."""
    consumer = await client.subscribe(topic, subscription)
    missing = set(wanted)
    while missing:
        missing.discard((await consumer.receive()).value)
    done = time.perf_counter()
    await consumer.close()
    return done


async def takeover_trial(cluster: Cluster, topic: str, number: int, settings: Settings) -> Trial:
    """SIGKILL the topic's owner under a producer; time until it is served again."""
    victim = cluster.by_url(await owner_of(cluster.urls, topic))
    survivors = [b.url for b in cluster.brokers if b is not victim]
    limit_s = settings.takeover_limit_s
    subscription = f"trial-{number}"
    async with Client(survivors, operation_timeout_s=limit_s) as client:
        await client.admin.create_subscription(topic, subscription)
        producer = await new_producer(client, topic, f"takeover-{number}", send_timeout_s=limit_s)
        prober = Prober(producer, f"t{number}", settings.size)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(prober.run(), name=f"prober-{number}")
            try:
                async with asyncio.timeout(limit_s):
                    await prober.warmed_up.wait()
            except TimeoutError as e:
                raise RuntimeError(f"trial {number}: the producer was not acknowledged") from e
            victim.kill()
            killed = time.perf_counter()
            prober.killed_at = killed
            before = {s.payload for s in prober.sends if s.acked is not None}
            unanswered = sum(1 for s in prober.sends if s.acked is None)
            try:
                async with asyncio.timeout(limit_s):
                    read = await read_back(client, topic, subscription, before)
                    await prober.answered.wait()
            except TimeoutError as e:
                raise RuntimeError(
                    f"trial {number}: {victim.name} killed {limit_s:g} s ago and the topic is "
                    f"not served again (first ack after the kill: "
                    f"{'yes' if prober.answered.is_set() else 'no'})"
                ) from e
            prober.stop()
        await producer.flush()
        await client.admin.delete_subscription(topic, subscription)
    first_ack = prober.first_ack_after_kill
    if first_ack is None:  # cannot happen: answered is set with it
        raise RuntimeError(f"trial {number}: no receipt after the kill")
    victim.start()
    await asyncio.to_thread(victim.wait_ready)
    home = await owner_of(cluster.urls, topic)
    return Trial(
        number=number,
        topic=topic,
        victim=victim.name,
        acked_before=len(before),
        unanswered_at_kill=unanswered,
        first_ack_s=first_ack - killed,
        read_back_s=read - killed,
        home_after=cluster.by_url(home).name,
        sends=prober.sends,
    )


@dataclass
class Verdict:
    acknowledged: int
    unknown: int
    unknown_stored: int
    problems: list[str]


async def verify(cluster: Cluster, trials: list[Trial]) -> Verdict:
    """Read each trial's topic up to an end marker: each acknowledged message once, in
    order."""
    got: list[bytes] = []
    async with Client(cluster.urls) as client:
        for topic in dict.fromkeys(t.topic for t in trials):
            await (await new_producer(client, topic, "end")).send(END)
            consumer = await client.subscribe(topic, "verify", initial_position="earliest")
            while (value := (await consumer.receive(timeout_s=VERIFY_IDLE_S)).value) != END:
                got.append(value)
    counts = Counter(got)
    sends = [s for t in trials for s in t.sends]
    acked = {s.payload for s in sends if s.acked is not None}
    unknown = {s.payload for s in sends if s.acked is None}
    problems: list[str] = []
    lost = [p for p in acked if counts[p] == 0]
    twice = [p for p in acked | unknown if counts[p] > 1]
    strange = [p for p in counts if p not in acked and p not in unknown]
    if lost:
        problems.append(f"{len(lost)} acknowledged messages are missing, e.g. {min(lost)[:24]!r}")
    if twice:
        problems.append(f"{len(twice)} messages are stored more than once, e.g. {twice[0][:24]!r}")
    if strange:
        problems.append(f"{len(strange)} messages nobody sent, e.g. {strange[0][:24]!r}")
    last: dict[bytes, int] = {}
    for value in got:
        name, seq, _ = value.split(b":", 2)
        if int(seq) <= last.get(name, -1):
            problems.append(f"{name.decode()}: message {int(seq)} after {last[name]}")
            break
        last[name] = int(seq)
    return Verdict(len(acked), len(unknown), sum(1 for p in unknown if counts[p]), problems)


async def takeover_trials(cluster: Cluster, settings: Settings) -> tuple[list[Trial], Verdict]:
    trials = []
    for number in range(1, settings.trials + 1):
        topic = f"{NAMESPACE}/takeover-{1 if settings.same_topic else number}"
        if number == 1 or not settings.same_topic:
            async with Client(cluster.urls) as client:
                await client.admin.create_topic(topic)
        trial = await takeover_trial(cluster, topic, number, settings)
        print(
            f"  trial {number}: killed {trial.victim}, served again after "
            f"{trial.takeover_s:.2f} s, now on {trial.home_after}",
            flush=True,
        )
        trials.append(trial)
    return trials, await verify(cluster, trials)


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


def print_takeover(trials: list[Trial], verdict: Verdict, settings: Settings) -> None:
    print(
        f"take-over after SIGKILL: replicated {REPLICATION}, session TTL "
        f"{settings.session_ttl_s:g} s, {len(trials)} trials; a producer at {RATE:g} msgs/s "
        f"through the two brokers that do not own the topic"
    )
    rows: list[tuple[str, ...]] = [
        (
            "trial",
            "killed",
            "acked before",
            "unanswered",
            "first ack s",
            "read back s",
            "take-over s",
            "home after restart",
        )
    ]
    for t in trials:
        rows.append(
            (
                str(t.number),
                t.victim,
                str(t.acked_before),
                str(t.unanswered_at_kill),
                f"{t.first_ack_s:.2f}",
                f"{t.read_back_s:.2f}",
                f"{t.takeover_s:.2f}",
                t.home_after,
            )
        )
    print_rows(rows, left=2)
    print(
        "(from the kill: first ack = first receipt of a message sent after it; read back = "
        "every message acknowledged before it received by a consumer attached after it; "
        "unanswered = sent but not acknowledged at the kill)"
    )

    def p(values: list[float]) -> str:
        return f"p50 {percentile(values, 50):.2f} s, p99 {percentile(values, 99):.2f} s"

    takeover = [t.takeover_s for t in trials]
    print(
        f"take-over: {p(takeover)} (session TTL {settings.session_ttl_s:g} s; mean "
        f"{statistics.fmean(takeover):.2f} s; first ack {p([t.first_ack_s for t in trials])}; "
        f"read back {p([t.read_back_s for t in trials])})"
    )
    if verdict.problems:
        for problem in verdict.problems:
            print(f"FAILED: {problem}")
    else:
        print(
            f"exactly once: all {verdict.acknowledged} acknowledged messages stored once, in "
            f"order; {verdict.unknown} sends without an answer, {verdict.unknown_stored} of "
            f"them stored (once)"
        )


async def run_all(
    plain: Cluster, replicated: Cluster, settings: Settings
) -> tuple[list[tuple[LoadResult, LoadResult]], list[Trial], Verdict]:
    pairs = await load_rounds(plain, replicated, settings)
    ctp = await ctp_rounds(plain, replicated, settings)
    print_load(pairs, ctp, settings)
    print(flush=True)
    trials, verdict = await takeover_trials(replicated, settings)
    return pairs, trials, verdict


def main(argv: list[str] | None = None) -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--seconds", type=float, default=3.0, help="length of each load window (default 3)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="load rounds (default 2)")
    parser.add_argument("--producers", type=int, default=4, help="producers (default 4)")
    parser.add_argument("--size", type=int, default=100, help="message bytes (default 100)")
    parser.add_argument("--trials", type=int, default=5, help="take-over trials (default 5)")
    parser.add_argument(
        "--session-ttl", type=float, default=2.0, help="brokers' session TTL, s (default 2)"
    )
    parser.add_argument(
        "--ctp-messages",
        type=int,
        default=2000,
        help="messages per transactional consume-transform-produce run (0: none; default 2000)",
    )
    parser.add_argument(
        "--same-topic",
        action="store_true",
        help="every take-over trial on one topic (see the module docstring: it fails)",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.producers < 1 or args.size < 1 or args.trials < 1:
        parser.error("--rounds, --producers, --size and --trials must be at least 1")
    if args.ctp_messages < 0:
        parser.error("--ctp-messages must be at least 0")
    settings = Settings(
        seconds=args.seconds,
        rounds=args.rounds,
        producers=args.producers,
        size=args.size,
        trials=args.trials,
        session_ttl_s=args.session_ttl,
        ctp_messages=args.ctp_messages,
        same_topic=args.same_topic,
    )

    started = time.perf_counter()
    directory = Path(tempfile.mkdtemp(prefix=".bench-ledger-replication-", dir=REPO))
    failed = True  # until the run ends without an error
    try:
        print(
            f"segtxn replication bench: {os.cpu_count()} CPUs; etcd single member, fsync on; "
            f"two clusters of {BROKERS} brokers in their own processes (unreplicated, and "
            f"--replication {REPLICATION}), session TTL {settings.session_ttl_s:g} s; ledgers "
            f"in {directory} ({filesystem_of(directory)})",
            flush=True,
        )
        with clusters(directory, settings.session_ttl_s) as (plain, replicated):
            _, trials, verdict = asyncio.run(run_all(plain, replicated, settings))
        failed = bool(verdict.problems)
    finally:
        if failed:
            print(f"the brokers' logs and files are kept in {directory}", file=sys.stderr)
        else:
            shutil.rmtree(directory, ignore_errors=True)
    print()
    print_takeover(trials, verdict, settings)
    print(f"\ntotal run time: {time.perf_counter() - started:.1f} s")
    return 1 if verdict.problems else 0


if __name__ == "__main__":
    sys.exit(main())
