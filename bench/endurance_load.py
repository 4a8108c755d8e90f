"""The endurance run's load (``bench/endurance.py``): steady, and bounded so it cannot grow.

Plain sends to ``input``, a consume-transform-produce loop in transactions from ``input`` to
``output``, a sink that acknowledges ``output``, and a split or a merge every few minutes;
the module docstring of ``bench/endurance.py`` says what each does and why it stays bounded.
The load keeps no state per message: its counts are ints, sampled with the resources.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Sequence
from dataclasses import asdict, dataclass

from growth import Sample

from segtxn.client import Client, ClientError, Consumer, Message, MessageId, ServerError

TOPICS = "topic://endurance/load"
INPUT, OUTPUT = f"{TOPICS}/input", f"{TOPICS}/output"
KEYS = 1000
TXN_TIMEOUT_S = 30.0
CHANGES = (("input", "split"), ("output", "split"), ("input", "merge"), ("output", "merge"))
LOAD_ERRORS = (ServerError, ClientError, TimeoutError)
"""What a load loop counts and carries on from: a split or a merge moves segments under it."""


@dataclass(frozen=True)
class Settings:
    """One endurance run, as its command line gives it (``bench/endurance.py --help``)."""

    duration_s: float
    warmup_s: float
    sample_every_s: float
    rate_per_s: float
    batch: int
    max_backlog: int
    change_every_s: float
    segments: int
    payload_bytes: int
    ledger_mib: float
    retention_time_s: float
    retention_check_s: float
    retire_check_s: float
    gc_retention_s: float
    key_depth: int
    defrag_min_free_mib: int = 32
    """Defragment the private etcd once this many MiB of its file are free (0: never)."""
    defrag_check_s: float = 300.0


@dataclass
class Counts:
    """What the load has done so far (ints only: the load keeps nothing per message)."""

    sent: int = 0
    send_errors: int = 0
    processed: int = 0
    committed: int = 0
    failed_txns: int = 0
    sunk: int = 0
    sink_errors: int = 0
    changes: int = 0
    change_errors: int = 0

    def sample(self) -> Sample:
        return {f"count.{name}": float(value) for name, value in asdict(self).items()}


class Load:
    """The feeder, the processor, the sink and the topology changes, until ``stop``."""

    def __init__(self, url: str, settings: Settings) -> None:
        self.url = url
        self.settings = settings
        self.counts = Counts()
        self.stop = asyncio.Event()
        self._payload = b"x" * settings.payload_bytes

    async def run(self) -> None:
        async with Client(self.url) as admin:
            for topic in (INPUT, OUTPUT):
                await admin.admin.create_topic(topic, segments=self.settings.segments)
                await admin.admin.create_subscription(
                    topic, "processors" if topic == INPUT else "sink", initial_position="earliest"
                )
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._feed(), name="feed")
            tasks.create_task(self._process(), name="process")
            tasks.create_task(self._sink(), name="sink")
            tasks.create_task(self._change(), name="change")

    async def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` or until the run stops."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.stop.wait()

    async def _feed(self) -> None:
        """``rate`` plain sends a second, a tenth of a second's worth at a time, all awaited
        before the next (bounded in flight); paused while the backlog is over its bound."""
        counts, tick_s = self.counts, 0.1
        per_tick = max(1, round(self.settings.rate_per_s * tick_s))
        loop = asyncio.get_running_loop()
        async with Client(self.url) as client:
            producer = await client.create_producer(INPUT)
            next_tick = loop.time()
            i = 0
            while not self.stop.is_set():
                if counts.sent - counts.processed > self.settings.max_backlog:
                    await self._pause(tick_s)
                    next_tick = loop.time()
                    continue
                pending: list[asyncio.Future[MessageId]] = []
                try:
                    for _ in range(per_tick):
                        key = f"k{i % KEYS}"
                        pending.append(await producer.send_async(self._payload, key=key))
                        i += 1
                    await settle(pending)
                    counts.sent += per_tick
                except LOAD_ERRORS:
                    counts.send_errors += 1
                    await asyncio.gather(*pending, return_exceptions=True)
                next_tick += tick_s
                await self._pause(max(0.0, next_tick - loop.time()))

    async def _receive(self, consumer: Consumer) -> list[Message]:
        """Up to ``batch`` messages: what has arrived, waiting a little for the first."""
        batch: list[Message] = []
        with contextlib.suppress(TimeoutError):
            batch.append(await consumer.receive(timeout_s=0.5))
            while len(batch) < self.settings.batch:
                batch.append(await consumer.receive(timeout_s=0.02))
        return batch

    async def _process(self) -> None:
        """One transaction per batch: a derived message per input to ``output``, the inputs
        acknowledged, commit. A failed transaction is aborted and its inputs come again."""
        counts = self.counts
        async with Client(self.url, prestart_transactions=True) as client:
            out = await client.create_producer(OUTPUT)
            consumer = await client.subscribe(
                INPUT, "processors", subscription_type="Shared", initial_position="earliest"
            )
            try:
                while not self.stop.is_set():
                    batch = await self._receive(consumer)
                    if not batch:
                        continue
                    txn = None
                    sends: list[asyncio.Future[MessageId]] = []
                    try:
                        txn = await client.transaction(timeout_s=TXN_TIMEOUT_S).start()
                        for m in batch:
                            sends.append(await out.send_async(m.value[::-1], key=m.key, txn=txn))
                        await settle([*sends, *(consumer.acknowledge(m, txn=txn) for m in batch)])
                        await txn.commit()
                        counts.committed += 1
                        counts.processed += len(batch)
                    except LOAD_ERRORS:
                        counts.failed_txns += 1
                        await asyncio.gather(*sends, return_exceptions=True)
                        if txn is not None:
                            with contextlib.suppress(*LOAD_ERRORS):
                                await txn.abort()
                        with contextlib.suppress(*LOAD_ERRORS):
                            await consumer.redeliver_unacknowledged()
            finally:
                await consumer.close()

    async def _sink(self) -> None:
        """Receive ``output`` and acknowledge every message (plain acks, all awaited)."""
        counts = self.counts
        async with Client(self.url) as client:
            consumer = await client.subscribe(
                OUTPUT, "sink", subscription_type="Shared", initial_position="earliest"
            )
            try:
                while not self.stop.is_set():
                    batch = await self._receive(consumer)
                    try:
                        await settle([consumer.acknowledge(m) for m in batch])
                        counts.sunk += len(batch)
                    except LOAD_ERRORS:
                        counts.sink_errors += 1
            finally:
                await consumer.close()

    async def _change(self) -> None:
        """Every ``change_every_s``: the next of :data:`CHANGES`."""
        counts, n = self.counts, 0
        async with Client(self.url) as client:
            while True:
                await self._pause(self.settings.change_every_s)
                if self.stop.is_set():
                    return
                role, op = CHANGES[n % len(CHANGES)]
                n += 1
                try:
                    await change_topology(client, INPUT if role == "input" else OUTPUT, op)
                    counts.changes += 1
                except LOAD_ERRORS as e:
                    counts.change_errors += 1
                    print(f"  {op} of {role} failed: {type(e).__name__}: {e}", flush=True)


async def settle(awaitables: Sequence[Awaitable[object]]) -> None:
    """Await every one, then raise the first failure: none is left running or unretrieved
    (an abandoned send's failure would be logged as "never retrieved")."""
    results = await asyncio.gather(*awaitables, return_exceptions=True)
    failure = next((r for r in results if isinstance(r, BaseException)), None)
    if failure is not None:
        raise failure


async def change_topology(client: Client, topic: str, op: str) -> None:
    """Split the widest active segment of ``topic``, or merge its first two (a split if one
    is left)."""
    stats = await client.admin.stats(topic)
    active = sorted(
        (s for s in stats["segments"] if s["state"] == "ACTIVE"), key=lambda s: s["range"][0]
    )
    if op == "split" or len(active) < 2:
        widest = max(active, key=lambda s: s["range"][1] - s["range"][0])
        await client.admin.split(topic, widest["id"])
    else:
        await client.admin.merge(topic, active[0]["id"], active[1]["id"])
