"""Histories kept in a topic of the run: the ``topics`` :class:`~.history.HistoryStore`.

A run recorded in topics leaves nothing on the recording machines that the checker needs:
every client's events go to ``topic://verify/<run>/history`` (one message per event, keyed by
the client, not in any transaction), so Spark reads them through the ``segtxn`` data source
from any executor, like the data under test (:func:`segtxn.verify.checker.load_topics`).

:class:`TopicHistory` writes one client's events: :meth:`~TopicHistory.record` queues an
event and returns at once (a fault injector records while the broker it killed is down); one
task sends the queue in order through one producer; :meth:`~TopicHistory.durable` waits for
the broker's acknowledgements. The producer de-duplicates its re-sends after a reconnect, so
no event is stored twice. :class:`TopicTail` follows the processors' events as the broker
stores them (a reader per segment of the history topic), for the fault injector.

The history topic is in the cluster under test: a bug that loses acknowledged data can lose
history events as well as data. A lost event only makes the checker see less (an input whose
``sent`` is gone is not looked for): the report's ``inputs sent`` then falls short of the
feed's count in ``run.json`` (``fed``). Record in files when the histories must not depend
on the system under test.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

import msgspec

from segtxn.client import Client, ClientError, Message, Reader, ScalableProducer, ServerError
from segtxn.protocol.names import TopicName
from segtxn.verify.history import (
    FileHistory,
    FileTail,
    HistoryBacklogFull,
    HistoryError,
    HistoryStore,
    HistoryTail,
    HistoryWriteFailed,
    HistoryWriter,
    event_line,
)

log = logging.getLogger(__name__)

HISTORY_SEGMENTS = 2
"""Segments of a run's history topic: clients spread over them, each client in one."""
MAX_QUEUED = 100_000
"""Events a history holds while the broker has not acknowledged them (~10 MB)."""
SEND_TIMEOUT_S = 300.0
"""How long one event may wait for the broker (through restarts of brokers and the store):
past it the event fails, and so does the history."""


def history_topic(run: str) -> str:
    """The history topic of run ``run``."""
    return f"topic://verify/{run}/history"


async def open_history(
    store: HistoryStore, name: str, *, run_dir: Path, topic: str, client: Client
) -> HistoryWriter:
    """Client ``name``'s history in ``store``: ``<run_dir>/history/<name>.jsonl``, or the
    run's history ``topic`` (which the orchestrator created) through ``client``."""
    if store is HistoryStore.FILES:
        return FileHistory(run_dir / "history", name)
    return await TopicHistory.open(client, topic, name)


async def open_tail(
    store: HistoryStore, names: list[str], *, run_dir: Path, topic: str, client: Client
) -> HistoryTail:
    """A tail following clients ``names`` where ``store`` keeps their histories."""
    if store is HistoryStore.FILES:
        return FileTail(run_dir / "history", names)
    return await TopicTail.follow(client, topic, names)


class TopicHistory(HistoryWriter):
    """One client's events in the run's history topic. Open with :meth:`open`."""

    def __init__(self, producer: ScalableProducer, client: str) -> None:
        self.client = client
        self._producer = producer
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=MAX_QUEUED)
        self._unacknowledged = 0
        self._settled = asyncio.Event()
        self._settled.set()
        self._failure: BaseException | None = None
        self._sender = asyncio.create_task(self._send(), name=f"history-{client}")

    @classmethod
    async def open(cls, client: Client, topic: str, name: str) -> TopicHistory:
        """``name``'s history in ``topic`` (which exists), recorded through ``client``.

        Raises:
            ServerError: the topic cannot take a producer (TopicNotFound, ...).
        """
        producer = await client.create_producer(topic, send_timeout_s=SEND_TIMEOUT_S)
        if not isinstance(producer, ScalableProducer):
            raise HistoryError(f"{topic}: a history topic is a scalable topic (topic://)")
        return cls(producer, name)

    def record(self, kind: str, **fields: Any) -> None:
        self._raise_failure()
        try:
            self._queue.put_nowait(event_line(self.client, kind, fields))
        except asyncio.QueueFull as e:
            raise HistoryBacklogFull(
                f"history of {self.client}: {MAX_QUEUED} events not yet acknowledged"
            ) from e
        self._unacknowledged += 1
        self._settled.clear()

    async def durable(self) -> None:
        await self._settled.wait()
        self._raise_failure()

    async def close(self) -> None:
        try:
            await self.durable()
        finally:
            self._sender.cancel()
            await asyncio.gather(self._sender, return_exceptions=True)
            await self._producer.close()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise HistoryWriteFailed(
                f"history of {self.client}: an event was not stored ({self._failure!r})"
            ) from self._failure

    async def _send(self) -> None:
        """Send the queued events in order (one task: the producer keeps their order)."""
        while True:
            line = await self._queue.get()
            try:
                stored = await self._producer.send_async(line, key=self.client)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the history is broken: record() and durable() say so
                self._fail(e)
                return
            stored.add_done_callback(self._acknowledged)

    def _acknowledged(self, stored: asyncio.Future[Any]) -> None:
        if stored.cancelled():
            self._fail(asyncio.CancelledError("the send was cancelled"))
            return
        error = stored.exception()
        if error is not None:
            self._fail(error)
            return
        self._unacknowledged -= 1
        if self._unacknowledged == 0:
            self._settled.set()

    def _fail(self, error: BaseException) -> None:
        if self._failure is None:
            log.error("history of %s: an event was not stored: %r", self.client, error)
            self._failure = error
        self._settled.set()  # durable() wakes up to raise it


class TopicTail(HistoryTail):
    """Follows the processors' events in the history topic: one reader per segment, each
    read by a task of this tail as the broker stores them. Start one with :meth:`follow`."""

    def __init__(self, clients: list[str]) -> None:
        super().__init__(clients)
        self._tasks: list[asyncio.Task[None]] = []
        self._failure: BaseException | None = None

    @classmethod
    async def follow(cls, client: Client, topic: str, clients: list[str]) -> TopicTail:
        """Follow ``clients`` in ``topic`` from its start (the topic is never split or
        merged, so its segments are the ones it was created with).

        Raises:
            ServerError: the topic cannot be read (TopicNotFound, ...).
        """
        tail = cls(clients)
        stats: dict[str, Any] = await client.admin.stats(topic)
        name = TopicName.parse(topic)
        for segment in sorted(s["id"] for s in stats["segments"]):
            reader = await client.create_reader(str(name.segment_name(segment)))
            task = asyncio.create_task(tail._follow(reader), name=f"history-tail-{segment}")
            tail._tasks.append(task)
        return tail

    async def poll(self) -> None:
        """The view is brought up to date as events arrive; this says when it no longer is.

        Raises:
            HistoryError: a segment's reader failed.
        """
        if self._failure is not None:
            raise HistoryError(f"the history topic cannot be followed: {self._failure!r}")

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _follow(self, reader: Reader) -> None:
        try:
            while True:
                message: Message = await reader.receive()
                try:
                    event = msgspec.json.decode(message.value)
                except msgspec.DecodeError:
                    log.warning("history: %s is not an event", message.message_id)
                    continue
                self.apply(str(event.get("client")), event)
        except asyncio.CancelledError:
            raise
        except (ServerError, ClientError) as e:  # TopicEnded included: nothing seals it
            self._failure = e
        finally:
            with contextlib.suppress(ServerError, ClientError):
                await reader.close()
