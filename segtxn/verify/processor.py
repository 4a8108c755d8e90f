"""One processor of the verification workload: consume, transform, produce, in transactions.

A processor is a Failover member of the input topic's ``processors`` subscription (so each
segment, and each key, is processed by one member at a time, in order). In a loop it takes a
batch of inputs, opens a transaction, sends one derived record per input to each of the two
output topics, acknowledges the inputs in the transaction, and then (seeded dice):

- commits (most of the time);
- aborts on purpose (``abort_rate``);
- stalls past the transaction's timeout and then tries to commit (``timeout_rate``): the
  coordinator has aborted it, so the commit must be refused.

With ``pipelined`` (about half of the soak's seeds, :mod:`segtxn.verify.plan`), each
batch's transaction ends (commit, abort, or the stall) while the next batch is worked on,
in a transaction that follows it (``client.transaction(after=...)``, docs/transactions.md,
"Pipelined transactions"); once one did not commit, the one following it is let end (it
aborts too) before the next batch is taken, and the next transaction follows none.

It relies on what the client and broker promise and nothing else: each segment's inputs
arrive in position order, and after a transaction that did not commit, its inputs come
again first (the broker rewinds the subscription; docs/protocol.md). So it just consumes,
transforms, produces, acknowledges, and commits or aborts, the way the docs tell users to.
Everything it does goes to its history (:mod:`segtxn.verify.history`, in files or in the
run's history topic); what it recorded is stored before it asks for a commit. SIGTERM ends
it after the transaction in hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
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
    ServerError,
    Transaction,
    TransactionFailed,
)
from segtxn.client.scalable import ScalableProducer
from segtxn.verify.history import (
    HistoryStore,
    HistoryWriter,
    Outcome,
    OutputRecord,
    decode_input,
    encode,
)
from segtxn.verify.history_topic import history_topic, open_history

log = logging.getLogger(__name__)

SUBSCRIPTION = "processors"


@dataclass(frozen=True)
class Topics:
    input: str
    out_a: str
    out_b: str
    history: str
    """Where the clients' histories go when they are kept in topics."""

    @classmethod
    def for_run(cls, run: str) -> Topics:
        return cls(
            f"topic://verify/{run}/input",
            f"topic://verify/{run}/out-a",
            f"topic://verify/{run}/out-b",
            history_topic(run),
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
    history: HistoryStore = HistoryStore.FILES
    pipelined: bool = False
    """End each batch's transaction while the next batch is worked on (see the module
    docstring)."""


class Processor:
    def __init__(self, config: ProcessorConfig, client: Client, history: HistoryWriter) -> None:
        self.config = config
        self.client = client
        self.session = uuid.uuid4().hex[:8]
        self.history = history
        self.rng = random.Random(f"{config.seed}-{config.name}-{self.session}")
        self.stopping = asyncio.Event()
        self.committed_by: dict[str, int] = {}
        """Committed transactions by who confirmed them (``Transaction.committed_by``: a
        broker's one-step commit, or a coordinator), logged when it stops."""
        self._previous: Transaction | None = None
        """(pipelined) The last batch's transaction, the next one follows it."""
        self._ending: asyncio.Task[Outcome] | None = None
        """(pipelined) Its end, under way while the next batch is worked on."""

    async def run(self) -> None:
        out_a = await self.client.create_producer(self.config.topics.out_a)
        out_b = await self.client.create_producer(self.config.topics.out_b)
        assert isinstance(out_a, ScalableProducer) and isinstance(out_b, ScalableProducer)
        consumer = await self.client.subscribe(
            self.config.topics.input,
            SUBSCRIPTION,
            subscription_type="Failover",
            initial_position="earliest",
            name=self.config.name,
        )
        try:
            while not self.stopping.is_set():
                batch = await self._batch(consumer)
                if batch:
                    await self._process(consumer, batch, out_a, out_b)
        finally:
            if self._ending is not None:  # (pipelined) the last one's end
                await self._ending
            await consumer.close()

    async def _batch(self, consumer: Consumer) -> list[Message]:
        """Up to ``batch`` inputs: what has arrived, waiting a little for the first."""
        batch: list[Message] = []
        with contextlib.suppress(TimeoutError):
            batch.append(await consumer.receive(timeout_s=0.5))
            while len(batch) < self.config.batch:
                batch.append(await consumer.receive(timeout_s=0.05))
        return batch

    async def _process(
        self,
        consumer: Consumer,
        batch: list[Message],
        out_a: ScalableProducer,
        out_b: ScalableProducer,
    ) -> None:
        """One transaction over ``batch``: worked on here; ended here, or (pipelined) while
        the next batch is worked on."""
        config = self.config
        try:
            txn = await self.client.transaction(
                timeout_s=config.txn_timeout_s, after=self._previous
            ).start()
        except (ServerError, ClientError) as e:
            log.warning(
                "%s: no transaction could start (%s); the inputs come again", config.name, e
            )
            await consumer.redeliver_unacknowledged()
            return
        name = str(txn.id)
        self.history.record("begin", session=self.session, txn=name)
        inputs: list[dict[str, Any]] = []
        outputs = 0
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
                await consumer.acknowledge_async(message, txn=txn)  # commit awaits it
        except (ServerError, ClientError) as e:
            log.info("%s: %s failed (%s: %s); aborting it", config.name, name, type(e).__name__, e)
            end = self._abort(txn, inputs, outputs)
        else:
            end = self._end(txn, inputs, outputs)
        if not config.pipelined:
            await end
            return
        ending = asyncio.create_task(end)
        previous, self._ending, self._previous = self._ending, ending, txn
        if previous is not None and await previous != "committed":
            await ending  # it follows one that did not commit: it aborts too, let it end
            self._ending = self._previous = None  # and the next follows none

    async def _abort(self, txn: Transaction, inputs: list[dict[str, Any]], outputs: int) -> Outcome:
        """A transaction whose work failed: abort it (never raising) and record its end."""
        started = asyncio.get_running_loop().time()
        with contextlib.suppress(ServerError, ClientError):
            await txn.abort()
        return self._ended(txn, "aborted", inputs, outputs, started)

    async def _end(self, txn: Transaction, inputs: list[dict[str, Any]], outputs: int) -> Outcome:
        """Commit, abort or stall ``txn`` (seeded dice), and record its end."""
        config = self.config
        name = str(txn.id)
        outcome: Outcome
        loop = asyncio.get_running_loop()
        try:
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
                self.history.record("committing", session=self.session, txn=name)
                await self.history.durable()  # no commit without its committing stored
                started = loop.time()  # the commit call's own time, not the history's
                try:
                    await txn.commit()
                    outcome = "committed"
                    by = txn.committed_by or "?"
                    self.committed_by[by] = self.committed_by.get(by, 0) + 1
                except TransactionFailed:
                    outcome = "aborted"  # an operation failed: the client aborted it
                except (ServerError, ClientError):
                    if txn.state == "ABORTED":  # the coordinator had aborted it
                        outcome = "timed_out" if stalled else "aborted"
                    else:
                        outcome = "commit_failed"  # unknown: either outcome is allowed
        except (ServerError, ClientError) as e:
            log.info("%s: %s failed (%s: %s); aborting it", config.name, name, type(e).__name__, e)
            with contextlib.suppress(ServerError, ClientError):
                await txn.abort()
            outcome = "aborted"
            started = loop.time()
        return self._ended(txn, outcome, inputs, outputs, started)

    def _ended(
        self,
        txn: Transaction,
        outcome: Outcome,
        inputs: list[dict[str, Any]],
        outputs: int,
        started: float,
    ) -> Outcome:
        name = str(txn.id)
        self.history.record(
            "ended",
            session=self.session,
            txn=name,
            outcome=outcome,
            inputs=inputs,
            outputs=outputs,
            commit_ms=(asyncio.get_running_loop().time() - started) * 1000,
        )
        log.debug("%s: %s %s (%d inputs)", self.config.name, name, outcome, len(inputs))
        return outcome


async def run_processor(config: ProcessorConfig) -> None:
    """Run until SIGTERM (or SIGINT)."""
    # a loop of transactions: the next one opens while this one runs
    async with Client(config.url, prestart_transactions=True) as client:
        history = await open_history(
            config.history,
            config.name,
            run_dir=config.run_dir,
            topic=config.topics.history,
            client=client,
        )
        processor = Processor(config, client, history)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, processor.stopping.set)
        try:
            await processor.run()
        finally:
            await history.close()
            log.info(
                "%s: transactions committed, by who confirmed them: %s",
                config.name,
                ", ".join(f"{by} {n}" for by, n in sorted(processor.committed_by.items()))
                or "none",
            )
