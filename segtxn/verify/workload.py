"""The verification workload: feed inputs, run processors, change the topology, inject faults.

:func:`run_workload` drives one run against a running cluster (any broker's URL):

1. creates the run's three scalable topics (input: 2 segments, out-a: 2, out-b: 2) and the
   processors' subscription (from the earliest input);
2. starts ``processors`` processor processes (``segtxn verify process``, see
   :mod:`segtxn.verify.processor`);
3. feeds ``inputs`` keyed, numbered inputs at ``rate`` per second, recording each stored one;
4. meanwhile splits and merges segments (``changes``, each while a processor has a
   transaction open) and injects the ``faults`` (:mod:`segtxn.verify.faults`: by default,
   SIGKILL p1 in the middle of the feed and start it again under the same name);
5. waits until every input is consumed (the subscription's backlog is zero), stops the
   processors with SIGTERM, and notes what input (if any) is left unacknowledged.

Every client records its events in its history (``history``: files in the run directory,
or the run's history topic, ``topic://verify/<run>/history``, created with the others; see
:mod:`segtxn.verify.history`). The run directory then holds ``logs/`` (the processors'
output), ``run.json`` (:class:`RunInfo`) and, with files, ``history/*.jsonl``; with topics the
orchestrator's last event (``run``) holds the :class:`RunInfo` too, so the checker needs
nothing but the cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import itertools
import json
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from segtxn.client import (
    Client,
    ClientError,
    InvalidArgument,
    MessageId,
    ScalableProducer,
    ServerError,
    TopicBusy,
)
from segtxn.verify.faults import (
    FaultContext,
    Servers,
    check_faults,
    run_faults,
    wait_for_open_transaction,
)
from segtxn.verify.history import HistoryStore, HistoryTail, HistoryWriter, InputRecord, encode
from segtxn.verify.history_topic import HISTORY_SEGMENTS, open_history, open_tail
from segtxn.verify.plan import DEMO_TOPOLOGY, Fault, FaultKind, TopologyChange
from segtxn.verify.processes import Launch, ManagedProcess
from segtxn.verify.processor import SUBSCRIPTION, Topics

T = TypeVar("T")

GAUGE_S = 1.0
"""How often the orchestrator samples the backlog and the active segments (``gauges``)."""

LEFTOVER_LIMIT_S = 60.0
"""How long the leftover check reads the inputs left after the processors stopped: enough
for a killed processor's open transaction (3 s by default) to time out and let its inputs
go, and for thousands of inputs on a busy machine."""


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
    changes: tuple[TopologyChange, ...] = DEMO_TOPOLOGY
    """Splits and merges during the feed."""
    faults: tuple[Fault, ...] = (Fault(FaultKind.KILL_PROCESSOR, 0.45, "p1"),)
    """Faults during the feed (server faults need the cluster: ``run_workload(servers=)``)."""
    drain_timeout_s: float = 120.0
    start_timeout_s: float = 60.0
    """How long the feed waits for every processor to connect (then it starts anyway)."""
    launch: Launch = field(default_factory=Launch)
    """The processors' verbosity and extra environment."""
    history: HistoryStore = HistoryStore.FILES
    """Where every client records its history."""
    pipelined: bool = False
    """The processors pipeline their transactions (:mod:`segtxn.verify.processor`)."""


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
    crashed: dict[str, list[int]] = field(default_factory=dict)
    """Processors that exited without being stopped or killed: their exit codes."""

    @property
    def history(self) -> HistoryStore:
        """Where the run's clients recorded their histories (files, for a run recorded
        before there was a choice)."""
        return HistoryStore(self.config.get("history", HistoryStore.FILES.value))

    def save(self, run_dir: Path) -> None:
        (run_dir / "run.json").write_text(json.dumps(asdict(self), indent=2))

    def record(self, history: HistoryWriter) -> None:
        """The run's last event in a history topic (``run``): what ``run.json`` holds, for a
        checker that has only the cluster (:func:`segtxn.verify.checker.load_topics`)."""
        history.record("run", info=asdict(self))

    @classmethod
    def load(cls, run_dir: Path) -> RunInfo:
        return cls(**json.loads((run_dir / "run.json").read_text()))


def processor_process(config: WorkloadConfig, name: str) -> ManagedProcess:
    """``segtxn verify process ...``: one processor, restartable, logged to ``logs/<name>.log``."""
    command = config.launch.segtxn(
        "verify", "process",
        "--url", config.url, "--run-dir", str(config.run_dir), "--run", config.run,
        "--name", name, "--seed", str(config.seed), "--batch", str(config.batch),
        "--abort-rate", str(config.abort_rate), "--timeout-rate", str(config.timeout_rate),
        "--txn-timeout", str(config.txn_timeout_s), "--history", config.history.value,
        *(["--pipelined"] if config.pipelined else []),
    )  # fmt: skip
    return ManagedProcess(name, command, config.run_dir / "logs" / f"{name}.log", config.launch)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    return str(value) if isinstance(value, Path) else value


async def run_workload(
    config: WorkloadConfig,
    progress: Callable[[str], None] = print,
    servers: Servers | None = None,
) -> RunInfo:
    """Run the workload; the run's :class:`RunInfo` (also saved as ``run.json``).

    Args:
        servers: the cluster, for faults on servers and etcd.

    Raises:
        ValueError: a fault this run cannot inject (an unknown processor, no ``servers``).
    """
    topics = Topics.for_run(config.run)
    names = [f"p{i}" for i in range(1, config.processors + 1)]
    check_faults(config.faults, names, servers is not None)
    config.run_dir.mkdir(parents=True, exist_ok=True)
    info = RunInfo(
        url=config.url,
        run=config.run,
        topics={"input": topics.input, "out_a": topics.out_a, "out_b": topics.out_b},
        config=_jsonable(asdict(config)),
        started=time.time(),
    )
    processors = {name: processor_process(config, name) for name in names}
    async with Client(config.url) as client:
        for topic in (topics.input, topics.out_a, topics.out_b):
            await client.admin.create_topic(topic, segments=2)
        if config.history is HistoryStore.TOPICS:
            await client.admin.create_topic(topics.history, segments=HISTORY_SEGMENTS)
        await client.admin.create_subscription(
            topics.input, SUBSCRIPTION, initial_position="earliest"
        )
        run_dir, topic = config.run_dir, topics.history
        history = await open_history(
            config.history, "orchestrator", run_dir=run_dir, topic=topic, client=client
        )
        tail = await open_tail(config.history, names, run_dir=run_dir, topic=topic, client=client)
        try:
            await _run(
                config=config, topics=topics, info=info, processors=processors, client=client,
                history=history, tail=tail, progress=progress, servers=servers,
            )  # fmt: skip
            info.ended = time.time()
            if config.history is HistoryStore.TOPICS:
                info.record(history)
        finally:
            await tail.close()
            await history.close()  # every event stored (or HistoryWriteFailed)
    info.save(config.run_dir)
    return info


async def _run(
    *,
    config: WorkloadConfig,
    topics: Topics,
    info: RunInfo,
    processors: dict[str, ManagedProcess],
    client: Client,
    history: HistoryWriter,
    tail: HistoryTail,
    progress: Callable[[str], None],
    servers: Servers | None,
) -> None:
    """Start the processors, feed them while the topology changes and the faults strike,
    wait for the drain, stop them; note what is left unacknowledged."""
    for processor in processors.values():
        await processor.start()
    try:
        waited = await _connected(client, topics, len(processors), config.start_timeout_s)
        progress(f"processors connected after {waited:.1f} s; feeding")
        feed_s = config.inputs / config.rate
        fed = asyncio.create_task(_feed(client, config, topics, info), name="feed")
        chaos = [
            asyncio.create_task(
                _report_progress(client, config, topics, info, history=history, progress=progress),
                name="progress",
            )
        ]
        if config.changes:
            changes = _change_topology(
                client, topics, config.changes, history=history, tail=tail, feed_s=feed_s
            )
            chaos.append(asyncio.create_task(changes, name="topology"))
        if config.faults:
            context = FaultContext(processors, history, tail, feed_s, servers, progress)
            chaos.append(asyncio.create_task(run_faults(config.faults, context), name="faults"))
        try:
            await fed
            await asyncio.gather(*chaos[1:])
            info.drained = await _drained(client, topics, config.drain_timeout_s)
            if not info.drained:  # what is each one stuck on? (in its log)
                dumps = [p.dump_stacks() for p in processors.values()]
                if servers is not None:
                    dumps.append(servers.dump_stacks())
                await asyncio.gather(*dumps)
        finally:
            for task in chaos:
                task.cancel()
            await asyncio.gather(*chaos, return_exceptions=True)
    finally:
        codes = [await p.stop() for p in processors.values()]
        progress(f"processors stopped (exit codes {codes})")
        info.crashed = {
            n: p.exited_on_its_own for n, p in processors.items() if p.exited_on_its_own
        }
        if info.crashed:
            progress(f"processors that exited by themselves (exit codes): {info.crashed}")
    info.leftover = await _leftover(client, topics)


async def _retrying(
    call: Callable[[], Awaitable[T]],
    limit_s: float = 60.0,
    also: tuple[type[ServerError], ...] = (),
) -> T:
    """An admin call, again while a server is down or moving (a fault is on), or on an error
    named in ``also``: up to ``limit_s``, then its error."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while True:
        try:
            return await call()
        except ServerError as e:
            if not (e.retriable or isinstance(e, also)) or loop.time() > deadline:
                raise
        await asyncio.sleep(0.2)  # sleep-ok: a retry's pace while a server restarts


async def _feed(client: Client, config: WorkloadConfig, topics: Topics, info: RunInfo) -> None:
    """``inputs`` messages over ``keys`` keys at ``rate``/s; each key's are numbered 0, 1, ..."""
    rng = random.Random(config.seed)
    history = await open_history(
        config.history, "feeder", run_dir=config.run_dir, topic=topics.history, client=client
    )
    producer = await client.create_producer(topics.input)
    assert isinstance(producer, ScalableProducer)
    next_seq: dict[str, int] = {}
    loop = asyncio.get_running_loop()
    start = loop.time()
    # in send order, recorded as they are stored: bounded by what the rate sends while the
    # oldest one waits (its send_timeout_s at most)
    pending: deque[tuple[str, int, asyncio.Future[MessageId]]] = deque()

    def record_stored(everything: bool) -> None:
        """Record the inputs stored so far (all of them: ``everything``, once settled)."""
        while pending and (everything or pending[0][2].done()):
            key, seq, future = pending.popleft()
            if not future.cancelled() and future.exception() is None:
                history.record("sent", key=key, seq=seq, id=str(future.result()))
                info.fed += 1

    try:
        for n in range(config.inputs):
            key = f"k{rng.randrange(config.keys)}"
            seq = next_seq.get(key, 0)
            next_seq[key] = seq + 1
            future = await producer.send_async(encode(InputRecord(key, seq)), key=key)
            pending.append((key, seq, future))
            record_stored(False)
            ahead = start + (n + 1) / config.rate - loop.time()
            if ahead > 0:
                await asyncio.sleep(ahead)  # sleep-ok: the feed's pace
        await producer.flush()
        await asyncio.gather(*(future for _, _, future in pending), return_exceptions=True)
        record_stored(True)
        info.feed_ended = time.time()
    finally:
        await history.close()


async def _active(client: Client, topic: str) -> list[dict[str, Any]]:
    stats = await client.admin.stats(topic)
    return sorted(
        (s for s in stats["segments"] if s["state"] == "ACTIVE"), key=lambda s: s["range"][0]
    )


async def _change_topology(
    client: Client,
    topics: Topics,
    changes: tuple[TopologyChange, ...],
    *,
    history: HistoryWriter,
    tail: HistoryTail,
    feed_s: float,
) -> None:
    """Each change at its time, once a processor has a transaction open (up to 2 s): split a
    topic's widest active segment, or merge its first two."""
    by_role = {"input": topics.input, "out-a": topics.out_a, "out-b": topics.out_b}
    loop = asyncio.get_running_loop()
    start = loop.time()
    for change in sorted(changes, key=lambda c: c.at):
        at = start + change.at * feed_s
        await asyncio.sleep(max(0.0, at - loop.time()))  # sleep-ok: the change's time
        open_txn = await wait_for_open_transaction(tail, None, 2.0)
        topic = by_role[change.topic]
        # re-planned on each attempt: a call lost with its server may have been applied, or be
        # finished by the restarted server, and then the segment we chose is sealed
        replan = functools.partial(_apply, client, topic, change.op)
        op, segments, result = await _retrying(replan, also=REPLAN)
        history.record(
            "topology", topic=topic, op=op, segments=segments, result=result, open=open_txn
        )


REPLAN = (InvalidArgument, TopicBusy)


async def _apply(client: Client, topic: str, op: str) -> tuple[str, list[int], dict[str, Any]]:
    """Split or merge; a merge with one active segment left (a merge lost with its server
    was applied after all) splits instead. Returns what it did."""
    active = await _active(client, topic)
    if op == "split" or len(active) < 2:
        target = max(active, key=lambda s: s["range"][1] - s["range"][0])
        return "split", [target["id"]], await client.admin.split(topic, target["id"])
    first, second = active[0], active[1]
    merged = await client.admin.merge(topic, first["id"], second["id"])
    return "merge", [first["id"], second["id"]], merged


async def _backlog(client: Client, topics: Topics) -> int:
    stats = await client.admin.stats(topics.input)
    total = 0
    for segment in stats["segments"]:
        subs = (segment.get("stats") or {}).get("subscriptions", {})
        total += int(subs.get(SUBSCRIPTION, {}).get("backlog", 0))
    return total


async def _connected(client: Client, topics: Topics, processors: int, limit_s: float) -> float:
    """Wait (bounded) until ``processors`` consumers are on each input segment's subscription
    (Failover members each attach to every segment), so that the feed, and the faults timed
    by it, start with every processor at work (one takes seconds to start on a busy
    machine). How long it took."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while loop.time() < start + limit_s:
        stats = await client.admin.stats(topics.input)
        subs = [(s.get("stats") or {}).get("subscriptions", {}) for s in stats["segments"]]
        if all(int(sub.get(SUBSCRIPTION, {}).get("consumers", 0)) >= processors for sub in subs):
            break
        await asyncio.sleep(0.1)  # sleep-ok: polling the broker's stats
    return loop.time() - start


async def _drained(client: Client, topics: Topics, limit_s: float) -> bool:
    """Wait (bounded) until the processors have consumed every input."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while loop.time() < deadline:
        with contextlib.suppress(ServerError, ClientError):  # a restarted server catching up
            if await _backlog(client, topics) == 0:
                return True
        await asyncio.sleep(0.25)  # sleep-ok: polling the broker's stats
    return False


async def _leftover(client: Client, topics: Topics) -> list[str]:
    """Inputs still unacknowledged on the processors' subscription once they have stopped.

    Each one is read and acknowledged. The processors are gone, so nothing else needs the
    subscription; and a split's children are delivered only after their parent's messages
    are acknowledged (per-key order), so reading without acknowledging stopped at the
    parents, and the children's inputs, left out, were then counted as acknowledged without
    output. Reads until the backlog is zero (inputs a killed processor's open transaction
    still holds come back when it times out), for at most ``LEFTOVER_LIMIT_S``."""
    if await _backlog(client, topics) == 0:
        return []
    consumer = await client.subscribe(
        topics.input, SUBSCRIPTION, subscription_type="Failover", name="leftover-check"
    )
    left: dict[str, None] = {}  # in order, once each (a redelivery repeats one)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LEFTOVER_LIMIT_S
    try:
        while loop.time() < deadline:
            try:
                message = await consumer.receive(timeout_s=1.0)
            except TimeoutError:
                if await _backlog(client, topics) == 0:
                    break
                continue
            left[str(message.message_id)] = None
            await consumer.acknowledge(message)
    finally:
        await consumer.close()
    return list(left)


async def _report_progress(
    client: Client,
    config: WorkloadConfig,
    topics: Topics,
    info: RunInfo,
    *,
    history: HistoryWriter,
    progress: Callable[[str], None],
) -> None:
    """Every second: the backlog and each topic's active segments, recorded as a ``gauges``
    event (the report plots them); every other second also a progress line."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    roles = {"input": topics.input, "out-a": topics.out_a, "out-b": topics.out_b}
    for tick in itertools.count(1):
        await asyncio.sleep(max(0.0, start + tick * GAUGE_S - loop.time()))  # sleep-ok: pace
        with contextlib.suppress(Exception):  # a display never fails the run
            backlog = await _backlog(client, topics)
            active = {role: len(await _active(client, t)) for role, t in roles.items()}
            history.record("gauges", backlog=backlog, fed=info.fed, active=active)
            if tick % 2 == 0:
                progress(
                    f"  {loop.time() - start:5.1f}s  fed {info.fed:,}/{config.inputs:,}  "
                    f"unconsumed {backlog:,}  active segments in/out-a/out-b "
                    f"{active['input']}/{active['out-a']}/{active['out-b']}"
                )
