"""One processor of the verification workload: consume, transform, produce, in transactions.

A processor is a Failover member of the input topic's ``processors`` subscription (so each
segment, and each key, is processed by one member at a time, in order). In a loop it takes a
batch of inputs, opens a transaction, sends one derived record per input to each of the two
output topics, acknowledges the inputs in the transaction, and then (seeded dice):

- commits (most of the time);
- aborts on purpose (``abort_rate``);
- stalls past the transaction's timeout and then tries to commit (``timeout_rate``): the
  coordinator has aborted it, so the commit must be refused.

After any transaction that did not commit, its inputs come back (released when the broker
learns the outcome), behind what the processor received meanwhile: it waits for them and goes
on in position order, which keeps each key's outputs in input order. If they do not come back
(the segment moved to another member), it subscribes again. Everything it does goes to its
history (:mod:`segtxn.verify.history`); SIGTERM ends it after the transaction in hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from segtxn.client import (
    Client,
    ClientError,
    Consumer,
    Message,
    MessageId,
    ServerError,
    TransactionFailed,
)
from segtxn.client.producer import ScalableProducer
from segtxn.verify.history import History, Outcome, OutputRecord, decode_input, encode

SUBSCRIPTION = "processors"


@dataclass(frozen=True)
class Topics:
    input: str
    out_a: str
    out_b: str

    @classmethod
    def for_run(cls, run: str) -> Topics:
        return cls(
            f"topic://verify/{run}/input",
            f"topic://verify/{run}/out-a",
            f"topic://verify/{run}/out-b",
        )


@dataclass(frozen=True)
class ProcessorConfig:
    url: str
    run_dir: Path
    topics: Topics
    name: str
    seed: int
    batch: int = 20
    abort_rate: float = 0.1
    timeout_rate: float = 0.02
    txn_timeout_s: float = 3.0
    hold_s: float = 0.02
    """Time spent inside each transaction before ending it (a kill lands mid-transaction)."""


class Processor:
    def __init__(self, config: ProcessorConfig, client: Client) -> None:
        self.config = config
        self.client = client
        self.session = uuid.uuid4().hex[:8]
        self.history = History(config.run_dir / "history", config.name)
        self.rng = random.Random(f"{config.seed}-{config.name}-{self.session}")
        self.stopping = asyncio.Event()
        self._owed: set[MessageId] = set()
        """Inputs of a transaction that did not commit, until they are delivered again."""
        self._held: list[Message] = []
        """Inputs received and not yet processed."""

    async def _subscribe(self) -> Consumer:
        return await self.client.subscribe(
            self.config.topics.input,
            SUBSCRIPTION,
            subscription_type="Failover",
            initial_position="earliest",
            name=self.config.name,
        )

    async def run(self) -> None:
        out_a = await self.client.create_producer(self.config.topics.out_a)
        out_b = await self.client.create_producer(self.config.topics.out_b)
        assert isinstance(out_a, ScalableProducer) and isinstance(out_b, ScalableProducer)
        consumer = await self._subscribe()
        try:
            while not self.stopping.is_set():
                if self._owed and not await self._take_back(consumer):
                    await consumer.close()  # they went elsewhere: start over, in order
                    consumer = await self._subscribe()
                batch = await self._batch(consumer)
                if not batch:
                    continue
                if not await self._process(consumer, batch, out_a, out_b):
                    self._owed = {m.message_id for m in batch}
        finally:
            await consumer.close()
            self.history.close()

    async def _take_back(self, consumer: Consumer) -> bool:
        """After a transaction that did not commit: its inputs come back (released when the
        broker learns the outcome), behind what we received meanwhile. Wait for them, then
        order what we hold by position, so each key goes on in order. False if they do not
        come back in time (the segment moved to another member)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 2 * self.config.txn_timeout_s
        held = {m.message_id for m in self._held}
        while not self._owed <= held:
            if loop.time() > deadline:
                self._owed, self._held = set(), []
                return False
            with contextlib.suppress(TimeoutError):
                message = await consumer.receive(timeout_s=0.1)
                if message.message_id not in held:
                    self._held.append(message)
                    held.add(message.message_id)
        self._owed = set()
        self._held.sort(key=lambda m: (m.message_id.topic, m.message_id[1:]))
        return True

    async def _batch(self, consumer: Consumer) -> list[Message]:
        """Up to ``batch`` inputs, what we hold first. A message given back to the broker
        (this member lost its segment for a moment) and delivered again counts once."""
        batch: dict[MessageId, Message] = {}
        while self._held and len(batch) < self.config.batch:
            message = self._held.pop(0)
            batch.setdefault(message.message_id, message)
        with contextlib.suppress(TimeoutError):
            if not batch:
                first = await consumer.receive(timeout_s=0.5)
                batch[first.message_id] = first
            while len(batch) < self.config.batch:
                message = await consumer.receive(timeout_s=0.05)
                batch.setdefault(message.message_id, message)
        return list(batch.values())

    async def _process(
        self,
        consumer: Consumer,
        batch: list[Message],
        out_a: ScalableProducer,
        out_b: ScalableProducer,
    ) -> bool:
        """One transaction over ``batch``; returns whether it committed."""
        config = self.config
        txn = await self.client.transaction(timeout_s=config.txn_timeout_s).start()
        name = str(txn.id)
        self.history.record("begin", session=self.session, txn=name)
        inputs: list[dict[str, Any]] = []
        outputs = 0
        outcome: Outcome
        loop = asyncio.get_running_loop()
        try:
            for message in batch:
                record = decode_input(message.value)
                input_id = str(message.message_id)
                consumed = {"key": record.key, "seq": record.seq, "id": input_id}
                inputs.append(consumed)
                self.history.record("received", session=self.session, **consumed)
                output = encode(OutputRecord(record.key, record.seq, input_id, name, config.name))
                await out_a.send_async(output, key=record.key, txn=txn)
                await out_b.send_async(output, key=record.key, txn=txn)
                outputs += 2
                await consumer.acknowledge(message, txn=txn)
            await asyncio.sleep(config.hold_s)  # sleep-ok: work inside the transaction
            dice = self.rng.random()
            started = loop.time()
            if dice < config.abort_rate:
                await txn.abort()
                outcome = "aborted"
            else:
                stalled = dice < config.abort_rate + config.timeout_rate
                if stalled:
                    await asyncio.sleep(config.txn_timeout_s + 1.0)  # sleep-ok: a stall
                    started = loop.time()
                self.history.record("committing", session=self.session, txn=name)
                try:
                    await txn.commit()
                    outcome = "committed"
                except TransactionFailed:
                    outcome = "aborted"  # an operation failed: the client aborted it
                except (ServerError, ClientError):
                    if txn.state == "ABORTED":  # the coordinator had aborted it
                        outcome = "timed_out" if stalled else "aborted"
                    else:
                        outcome = "commit_failed"  # unknown: either outcome is allowed
        except (ServerError, ClientError):
            with contextlib.suppress(ServerError, ClientError):
                await txn.abort()
            outcome = "aborted"
            started = loop.time()
        self.history.record(
            "ended",
            session=self.session,
            txn=name,
            outcome=outcome,
            inputs=inputs,
            outputs=outputs,
            commit_ms=(loop.time() - started) * 1000,
        )
        return outcome == "committed"


async def run_processor(config: ProcessorConfig) -> None:
    """Run until SIGTERM (or SIGINT)."""
    async with Client(config.url) as client:
        processor = Processor(config, client)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, processor.stopping.set)
        await processor.run()
