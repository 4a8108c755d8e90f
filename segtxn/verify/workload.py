"""The verification workload: feed inputs, run processors, change the topology, kill one.

:func:`run_workload` drives one run against a running cluster (any broker's URL):

1. creates the run's three scalable topics (input: 2 segments, out-a: 2, out-b: 2) and the
   processors' subscription (from the earliest input);
2. starts ``processors`` processor processes (``segtxn verify process``, see
   :mod:`segtxn.verify.processor`);
3. feeds ``inputs`` keyed, numbered inputs at ``rate`` per second, recording each stored one;
4. meanwhile splits and merges segments of all three topics, and SIGKILLs one processor in
   the middle of the feed (and starts it again under the same name);
5. waits until every input is consumed (the subscription's backlog is zero), stops the
   processors with SIGTERM, and notes what input (if any) is left unacknowledged.

The run directory then holds ``history/*.jsonl`` (every client's events), ``logs/`` (the
processors' output) and ``run.json`` (:class:`RunInfo`): what the checker needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import random
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from segtxn.client import Client, MessageId, ScalableProducer
from segtxn.verify.history import History, InputRecord, encode, read_events
from segtxn.verify.processor import SUBSCRIPTION, Topics


@dataclass(frozen=True)
class WorkloadConfig:
    url: str
    run_dir: Path
    run: str = "run"
    """Names the topics (``topic://verify/<run>/...``): one name per run on a cluster."""
    inputs: int = 5000
    keys: int = 50
    rate: float = 100.0
    """Inputs fed per second."""
    processors: int = 3
    batch: int = 20
    abort_rate: float = 0.1
    timeout_rate: float = 0.02
    txn_timeout_s: float = 3.0
    seed: int = 0
    topology: bool = True
    """Split and merge segments during the feed."""
    kill: bool = True
    """SIGKILL one processor mid-feed (and start it again)."""
    drain_timeout_s: float = 120.0


@dataclass
class RunInfo:
    url: str
    run: str
    topics: dict[str, str]
    config: dict[str, Any]
    started: float
    fed: int = 0
    feed_ended: float = 0.0
    drained: bool = False
    ended: float = 0.0
    leftover: list[str] = field(default_factory=list)
    """Input ids still unacknowledged on the subscription after the processors stopped."""

    def save(self, run_dir: Path) -> None:
        (run_dir / "run.json").write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, run_dir: Path) -> RunInfo:
        return cls(**json.loads((run_dir / "run.json").read_text()))


class ProcessorProcess:
    """``python -m segtxn.cli verify process ...``: one processor, restartable."""

    def __init__(self, config: WorkloadConfig, topics: Topics, name: str) -> None:
        self.name = name
        self._command = [
            sys.executable, "-m", "segtxn.cli", "verify", "process",
            "--url", config.url, "--run-dir", str(config.run_dir), "--run", config.run,
            "--name", name, "--seed", str(config.seed), "--batch", str(config.batch),
            "--abort-rate", str(config.abort_rate), "--timeout-rate", str(config.timeout_rate),
            "--txn-timeout", str(config.txn_timeout_s),
        ]  # fmt: skip
        logs = config.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self._log: IO[bytes] = open(logs / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop()
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            *self._command, stdout=self._log, stderr=asyncio.subprocess.STDOUT
        )

    async def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        await self.process.wait()

    async def stop(self, limit_s: float = 30.0) -> int | None:
        """SIGTERM (it ends after the transaction in hand), SIGKILL after ``limit_s``."""
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), limit_s)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        self._log.close()
        return None if self.process is None else self.process.returncode


async def run_workload(config: WorkloadConfig, progress: Callable[[str], None] = print) -> RunInfo:
    topics = Topics.for_run(config.run)
    config.run_dir.mkdir(parents=True, exist_ok=True)
    info = RunInfo(
        url=config.url,
        run=config.run,
        topics={"input": topics.input, "out_a": topics.out_a, "out_b": topics.out_b},
        config={k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
        started=time.time(),
    )
    history = History(config.run_dir / "history", "orchestrator")
    processors = [
        ProcessorProcess(config, topics, f"p{i}") for i in range(1, config.processors + 1)
    ]
    async with Client(config.url) as client:
        for topic in (topics.input, topics.out_a, topics.out_b):
            await client.admin.create_topic(topic, segments=2)
        await client.admin.create_subscription(
            topics.input, SUBSCRIPTION, initial_position="earliest"
        )
        for processor in processors:
            await processor.start()
        try:
            feed_s = config.inputs / config.rate
            fed = asyncio.create_task(_feed(client, config, topics, info))
            chaos = [asyncio.create_task(_report_progress(client, config, topics, info, progress))]
            if config.topology:
                chaos.append(asyncio.create_task(_change_topology(client, topics, history, feed_s)))
            if config.kill and processors:
                chaos.append(asyncio.create_task(_kill_one(processors[0], config, history, feed_s)))
            try:
                await fed
                await asyncio.gather(*chaos[1:])
                info.drained = await _drained(client, topics, config.drain_timeout_s)
            finally:
                for task in chaos:
                    task.cancel()
                await asyncio.gather(*chaos, return_exceptions=True)
        finally:
            codes = [await p.stop() for p in processors]
            progress(f"processors stopped (exit codes {codes})")
        info.leftover = await _leftover(client, topics)
    history.close()
    info.ended = time.time()
    info.save(config.run_dir)
    return info


async def _feed(client: Client, config: WorkloadConfig, topics: Topics, info: RunInfo) -> None:
    """``inputs`` messages over ``keys`` keys at ``rate``/s; each key's are numbered 0, 1, ..."""
    rng = random.Random(config.seed)
    history = History(config.run_dir / "history", "feeder")
    producer = await client.create_producer(topics.input)
    assert isinstance(producer, ScalableProducer)
    next_seq: dict[str, int] = {}
    loop = asyncio.get_running_loop()
    start = loop.time()
    pending: set[asyncio.Future[MessageId]] = set()

    def stored(key: str, seq: int, future: asyncio.Future[MessageId]) -> None:
        pending.discard(future)
        if not future.cancelled() and future.exception() is None:
            history.record("sent", key=key, seq=seq, id=str(future.result()))
            info.fed += 1

    for n in range(config.inputs):
        key = f"k{rng.randrange(config.keys)}"
        seq = next_seq.get(key, 0)
        next_seq[key] = seq + 1
        future = await producer.send_async(encode(InputRecord(key, seq)), key=key)
        pending.add(future)
        future.add_done_callback(functools.partial(stored, key, seq))
        ahead = start + (n + 1) / config.rate - loop.time()
        if ahead > 0:
            await asyncio.sleep(ahead)  # sleep-ok: the feed's pace
    await producer.flush()
    await asyncio.gather(*pending, return_exceptions=True)
    info.feed_ended = time.time()
    history.close()


async def _active(client: Client, topic: str) -> list[dict[str, Any]]:
    stats = await client.admin.stats(topic)
    return sorted(
        (s for s in stats["segments"] if s["state"] == "ACTIVE"), key=lambda s: s["range"][0]
    )


async def _change_topology(client: Client, topics: Topics, history: History, feed_s: float) -> None:
    """Split the input twice, split out-a, merge out-b's two segments; spread over the feed."""
    plan: list[tuple[float, str, str]] = [
        (0.2, topics.input, "split"),
        (0.35, topics.out_a, "split"),
        (0.5, topics.out_b, "merge"),
        (0.65, topics.input, "split"),
    ]
    loop = asyncio.get_running_loop()
    start = loop.time()
    for at, topic, op in plan:
        await asyncio.sleep(max(0.0, start + at * feed_s - loop.time()))  # sleep-ok: schedule
        active = await _active(client, topic)
        if op == "split":
            target = max(active, key=lambda s: s["range"][1] - s["range"][0])
            result = await client.admin.split(topic, target["id"])
            segments = [target["id"]]
        else:
            first, second = active[0], active[1]
            result = await client.admin.merge(topic, first["id"], second["id"])
            segments = [first["id"], second["id"]]
        history.record("topology", topic=topic, op=op, segments=segments, result=result)


async def _kill_one(
    victim: ProcessorProcess, config: WorkloadConfig, history: History, feed_s: float
) -> None:
    """SIGKILL ``victim`` at 45% of the feed, inside a transaction if it has one open, and
    start it again (it comes back under its name: its segments wait for it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 0.45 * feed_s
    await asyncio.sleep(max(0.0, deadline - loop.time()))  # sleep-ok: schedule
    open_txn = None
    for _ in range(200):  # up to ~2 s to catch it mid-transaction
        open_txn = _open_transaction(config.run_dir / "history", victim.name)
        if open_txn is not None:
            break
        await asyncio.sleep(0.01)  # sleep-ok: polling a file another process writes
    await victim.kill()
    history.record("killed", victim=victim.name, txn=open_txn)
    await victim.start()


def _open_transaction(directory: Path, client: str) -> str | None:
    """The transaction ``client`` began and has not ended, per its history."""
    path = directory / f"{client}.jsonl"
    if not path.exists():
        return None
    open_txn = None
    for event in read_events(path):
        if event.get("kind") == "begin":
            open_txn = event.get("txn")
        elif event.get("kind") == "ended" and event.get("txn") == open_txn:
            open_txn = None
    return open_txn


async def _backlog(client: Client, topics: Topics) -> int:
    stats = await client.admin.stats(topics.input)
    total = 0
    for segment in stats["segments"]:
        subs = (segment.get("stats") or {}).get("subscriptions", {})
        total += int(subs.get(SUBSCRIPTION, {}).get("backlog", 0))
    return total


async def _drained(client: Client, topics: Topics, limit_s: float) -> bool:
    """Wait (bounded) until the processors have consumed every input."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while loop.time() < deadline:
        if await _backlog(client, topics) == 0:
            return True
        await asyncio.sleep(0.25)  # sleep-ok: polling the broker's stats
    return False


async def _leftover(client: Client, topics: Topics) -> list[str]:
    """Inputs still unacknowledged on the processors' subscription (read, not acked)."""
    if await _backlog(client, topics) == 0:
        return []
    consumer = await client.subscribe(
        topics.input, SUBSCRIPTION, subscription_type="Failover", name="leftover-check"
    )
    left: list[str] = []
    with contextlib.suppress(TimeoutError):
        while True:
            left.append(str((await consumer.receive(timeout_s=2.0)).message_id))
    await consumer.close()
    return left


async def _report_progress(
    client: Client,
    config: WorkloadConfig,
    topics: Topics,
    info: RunInfo,
    progress: Callable[[str], None],
) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:
        await asyncio.sleep(2.0)  # sleep-ok: a progress display's pace
        with contextlib.suppress(Exception):  # a display never fails the run
            backlog = await _backlog(client, topics)
            shapes = [
                len(await _active(client, t)) for t in (topics.input, topics.out_a, topics.out_b)
            ]
            progress(
                f"  {loop.time() - start:5.1f}s  fed {info.fed:,}/{config.inputs:,}  "
                f"unconsumed {backlog:,}  active segments in/out-a/out-b "
                f"{shapes[0]}/{shapes[1]}/{shapes[2]}"
            )
