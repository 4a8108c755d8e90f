"""``bench/replication.py``'s second half: take-over after a SIGKILL on the replicated
cluster (a producer at a fixed rate, its topic's owner killed under it, the time until the
topic is served again), the exactly-once check of every trial's topic, and the table it
prints.

It is a module of its own because it shares nothing with the produce load
(``replload.py``) but the clusters (``replclusters.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from common import percentile, print_rows
from replclusters import NAMESPACE, REPLICATION, Cluster, Settings, new_producer, owner_of

from segtxn.client import Client, MessageId, Producer

RATE = 200.0
"""msgs/s of the take-over trials' producer."""
PRE_KILL_S = 1.0
"""The trial's producer gets this long's worth of receipts before the kill."""
VERIFY_IDLE_S = 20.0
"""The final read receiving nothing this long before the end marker: it fails."""
END = b"end of the take-over trials"


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
