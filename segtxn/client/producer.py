"""Producers: send messages, survive reconnects without duplicates, route keys to segments.

A :class:`Producer` writes to one ``persistent://`` topic or one segment over one WebSocket.
Every message gets the next sequence id of the producer's *name*; the broker stores a
(name, sequence id) once, so after a reconnect every unacknowledged message is simply sent
again. The first sequence id continues from what the broker last stored for the name, so a
restarted application that reuses its producer name is de-duplicated too.

At most ``max_pending`` messages are in flight: ``send`` waits for room (backpressure).
With batching, messages queued while a frame is being written travel together in one
``SendBatch`` frame (``batch_delay_s`` may hold a batch open a little longer).

A :class:`ScalableProducer` routes keyed messages of a ``topic://`` to the active segment
whose hash range covers the key (unkeyed ones go round-robin), one Producer per segment.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from dataclasses import dataclass

import aiohttp
import msgspec

from segtxn.aio import first_completed
from segtxn.client.connection import Connector
from segtxn.client.errors import ClientClosed, MessageTooLarge, Timeout
from segtxn.client.layout import TopicLayout
from segtxn.client.messages import MessageId
from segtxn.client.transaction import Transaction
from segtxn.protocol import frames
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.frames import Error, ProducerReady, Receipt, Send, SendBatch
from segtxn.protocol.names import TopicName

log = logging.getLogger(__name__)
_names = itertools.count(1)

FATAL = {
    ErrorName.TOPIC_NOT_FOUND,
    ErrorName.INVALID_TOPIC_NAME,
    ErrorName.NOT_ALLOWED,
    ErrorName.PRODUCER_BUSY,
    ErrorName.INVALID_ARGUMENT,
}


@dataclass(frozen=True)
class ProducerOptions:
    batching: bool = True
    batch_max_messages: int = 1000
    batch_max_bytes: int = 1024 * 1024
    batch_delay_s: float = 0.0
    max_pending: int = 1000
    reconnect_max_s: float = 2.0
    send_timeout_s: float = 30.0
    """A send not acknowledged in this time fails with Timeout and is not sent again
    (it may still have been stored). 0: wait as long as it takes."""


@dataclass(eq=False)
class _Pending:
    send: Send
    future: asyncio.Future[MessageId]


class Producer:
    def __init__(
        self,
        connector: Connector,
        topic: TopicName,
        name: str | None = None,
        options: ProducerOptions | None = None,
    ) -> None:
        self.topic = topic
        self.name = name or f"producer-{next(_names)}-{id(self):x}"
        self.options = options or ProducerOptions()
        self._connector = connector
        self._pending: dict[int, _Pending] = {}  # seq -> pending, in seq order
        self._unsent: deque[int] = deque()
        self._window = asyncio.Semaphore(self.options.max_pending)
        self._ready = asyncio.Event()
        self._wake = asyncio.Event()
        self._next_seq = 0
        self._max_bytes = 0
        self._failure: BaseException | None = None
        self._closed = False
        self._connected = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.reconnects = 0
        self.refused = False
        """The broker refused a send because the topic is terminated (a sealed segment)."""

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Connect; raises the broker's error if it refuses the producer."""
        ws = await self._connect()
        self._task = asyncio.create_task(self._run(ws), name=f"producer-{self.name}")

    async def _connect(self) -> aiohttp.ClientWebSocketResponse:
        broker = await self._connector.broker_for(self.topic)
        ws = await self._connector.websocket(
            broker, "producer", self.topic, "", {"name": self.name}
        )
        message = await ws.receive()
        if message.type is not aiohttp.WSMsgType.BINARY:
            await ws.close()
            raise ServerError(ErrorName.SERVICE_NOT_READY, "the broker closed the producer")
        ready = frames.server_frame.decode(message.data)
        if not isinstance(ready, ProducerReady):
            await ws.close()
            raise ServerError(ErrorName.UNKNOWN, f"expected producer_ready, got {ready!r}")
        self._max_bytes = ready.max_message_bytes
        if not self._ready.is_set():
            self._next_seq = ready.last_sequence_id + 1
            self._ready.set()
        # everything not yet acknowledged goes again, in order (the broker de-duplicates)
        self._unsent = deque(sorted(self._pending))
        self._wake.set()
        self._connected.set()
        return ws

    async def _run(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        delay = 0.05
        while True:
            try:
                await first_completed(self._write(ws), self._read(ws), name=f"producer-{self.name}")
            except ServerError as e:
                if e.name in FATAL:
                    self._fail_all(e)
                    return
            except (aiohttp.ClientError, ConnectionError) as e:
                log.info("producer %s lost its connection: %s", self.name, e)
            finally:
                self._connected.clear()
                await ws.close()
            if self._closed:
                return
            while True:  # reconnect, backing off
                await asyncio.sleep(delay)
                try:
                    ws = await self._connect()
                    self.reconnects += 1
                    delay = 0.05
                    break
                except ServerError as e:
                    if e.name in FATAL:
                        self._fail_all(e)
                        return
                    delay = min(delay * 2, self.options.reconnect_max_s)

    async def _write(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        options = self.options
        while True:
            await self._wake.wait()
            self._wake.clear()
            if options.batch_delay_s and len(self._unsent) < options.batch_max_messages:
                await asyncio.sleep(options.batch_delay_s)  # let the batch fill a little
            while self._unsent:
                batch: list[Send] = []
                size = 0
                while self._unsent and len(batch) < (
                    options.batch_max_messages if options.batching else 1
                ):
                    seq = self._unsent[0]
                    pending = self._pending.get(seq)
                    if pending is None:  # already acknowledged
                        self._unsent.popleft()
                        continue
                    if batch and size + len(pending.send.payload) > options.batch_max_bytes:
                        break
                    self._unsent.popleft()
                    batch.append(pending.send)
                    size += len(pending.send.payload)
                if not batch:
                    break
                frame: frames.Frame = batch[0] if len(batch) == 1 else SendBatch(sends=batch)
                await ws.send_bytes(frames.encode(frame))

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for message in ws:
            if message.type is not aiohttp.WSMsgType.BINARY:
                continue
            try:
                frame = frames.server_frame.decode(message.data)
            except msgspec.DecodeError:
                log.warning("producer %s: undecodable frame from the broker", self.name)
                continue
            if isinstance(frame, Receipt):
                self._settle(frame.seq, result=MessageId(str(self.topic), *frame.message_id))
            elif isinstance(frame, Error):
                error = ServerError(ErrorName(frame.error), frame.message)
                if frame.seq is not None:
                    self._settle(frame.seq, error=error)
                else:
                    log.warning("producer %s: %s", self.name, error)
        raise ConnectionError("the broker closed the connection")

    def _settle(
        self, seq: int, *, result: MessageId | None = None, error: BaseException | None = None
    ) -> None:
        pending = self._pending.pop(seq, None)
        if pending is None or pending.future.done():
            return
        if error is not None:
            if isinstance(error, ServerError) and error.name is ErrorName.TOPIC_TERMINATED:
                self.refused = True
            pending.future.set_exception(error)
        else:
            pending.future.set_result(result)  # type: ignore[arg-type]

    def _fail_all(self, error: BaseException) -> None:
        self._failure = error
        for seq in list(self._pending):
            self._settle(seq, error=error)

    # ------------------------------------------------------------------ sending

    async def send(
        self,
        value: bytes,
        *,
        key: str | None = None,
        properties: dict[str, str] | None = None,
        event_time_ms: int | None = None,
        txn: Transaction | None = None,
    ) -> MessageId:
        """Send one message; returns its id once the broker has stored it durably (in
        ``txn``: stored, and visible only if the transaction commits).

        Raises:
            MessageTooLarge: the payload exceeds what the broker accepts.
            ServerError: the broker refused this message (e.g. TopicTerminatedError).
            Timeout: not acknowledged within ``send_timeout_s`` (it may have been stored).
            ClientClosed: the producer was closed.
        """
        future = await self.send_async(
            value, key=key, properties=properties, event_time_ms=event_time_ms, txn=txn
        )
        return await future

    def _expire(self, seq: int) -> None:
        pending = self._pending.get(seq)
        if pending is not None and not pending.future.done():
            self._settle(
                seq,
                error=Timeout(
                    f"message {seq} was not acknowledged in {self.options.send_timeout_s}s; "
                    "it may or may not have been stored"
                ),
            )

    async def send_async(
        self,
        value: bytes,
        *,
        key: str | None = None,
        properties: dict[str, str] | None = None,
        event_time_ms: int | None = None,
        txn: Transaction | None = None,
        registered: bool = False,
        track: bool = True,
    ) -> asyncio.Future[MessageId]:
        """Queue one message (waiting for room in the window); the future resolves to its
        id once stored. Messages queued by one task are stored in the order queued."""
        if txn is not None and not registered:
            await txn.add_partition(str(self.topic))
        if self._closed:
            raise ClientClosed(f"producer {self.name} is closed")
        if self._failure is not None:
            raise self._failure
        if not isinstance(value, bytes):
            raise TypeError("a message value is bytes")
        if self._max_bytes and len(value) > self._max_bytes:
            raise MessageTooLarge(f"{len(value)} bytes exceeds the broker's {self._max_bytes}")
        await self._window.acquire()
        seq = self._next_seq
        self._next_seq += 1
        future: asyncio.Future[MessageId] = asyncio.get_running_loop().create_future()
        future.add_done_callback(lambda _: self._window.release())
        send = Send(
            seq=seq,
            payload=value,
            key=key,
            properties=dict(properties or {}),
            event_time_ms=event_time_ms,
            txn=None if txn is None else txn.wire_id,
        )
        self._pending[seq] = _Pending(send, future)
        self._unsent.append(seq)
        self._wake.set()
        if self.options.send_timeout_s:
            timer = asyncio.get_running_loop().call_later(
                self.options.send_timeout_s, self._expire, seq
            )
            future.add_done_callback(lambda _: timer.cancel())
        if txn is not None and track:
            txn.track(future)
        return future

    async def flush(self) -> None:
        """Wait until every message sent so far is stored (or failed)."""
        waiting = [p.future for p in self._pending.values()]
        await asyncio.gather(*waiting, return_exceptions=True)

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def close(self) -> None:
        """Flush, then disconnect. Idempotent."""
        if self._closed:
            return
        if self._failure is None and self._task is not None and not self._task.done():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(30):
                    await self.flush()
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._fail_all(ClientClosed(f"producer {self.name} is closed"))


@dataclass(eq=False)
class _Outgoing:
    number: int
    """The order the application sent it in (re-sends keep it)."""
    value: bytes
    key: str | None
    properties: dict[str, str] | None
    event_time_ms: int | None
    txn: Transaction | None
    result: asyncio.Future[MessageId]


class ScalableProducer:
    """Routes messages of a scalable topic to its segments by key hash.

    The segment DAG comes from a lookup session (pushed on every change). A send that
    reaches a segment sealed meanwhile is refused (``TopicTerminatedError``: nothing was
    stored) and sent again to the segment now covering its key. While any send to a segment
    that is no longer active is unsettled, or refused sends wait to go again, the producer
    is *in transition*: new sends queue behind, and the refused ones go first, in the order
    they were sent. So each key's messages are stored in order across a split or merge;
    nothing is lost and nothing is stored twice (a sealed segment stores nothing).
    """

    def __init__(
        self,
        connector: Connector,
        topic: TopicName,
        name: str | None = None,
        options: ProducerOptions | None = None,
    ) -> None:
        self.topic = topic
        self.name = name or f"producer-{next(_names)}-{id(self):x}"
        self.options = options or ProducerOptions()
        self._connector = connector
        self.layout = TopicLayout(connector, topic)
        self._producers: dict[int, Producer] = {}
        self._round_robin = itertools.count()
        self._numbers = itertools.count()
        self._lock = asyncio.Lock()
        self._order = asyncio.Lock()  # FIFO: one sender at a time while in transition
        self._refused: list[_Outgoing] = []
        self._unsettled: dict[int, set[asyncio.Future[MessageId]]] = {}
        """Segment id -> sends routed there whose outcome :meth:`_settled` has not taken in
        (a segment producer forgets a send a moment before that: no gap in between)."""
        self._drainer: asyncio.Task[None] | None = None
        self.reroutes = 0

    async def start(self) -> None:
        await self.layout.start()

    async def refresh(self) -> None:
        """Re-read the topic's segments now."""
        await self.layout.refresh()

    def route(self, key: str | None) -> int:
        """The id of the active segment for ``key`` (round-robin when there is none)."""
        return self.layout.route(key, next(self._round_robin))

    async def _producer(self, segment_id: int) -> Producer:
        producer = self._producers.get(segment_id)
        if producer is None:
            async with self._lock:
                producer = self._producers.get(segment_id)
                if producer is None:
                    producer = Producer(
                        self._connector,
                        self.topic.segment_name(segment_id),
                        f"{self.name}-s{segment_id}",
                        self.options,
                    )
                    await producer.start()
                    self._producers[segment_id] = producer
        return producer

    def _retired(self) -> list[int]:
        """Segments no longer active, or that refused a send (sealed: their sends may be
        refused)."""
        return [
            segment
            for segment, producer in self._producers.items()
            if producer.refused or not (s := self.layout.segments.get(segment)) or not s.active
        ]

    def _unsettled_on_retired(self) -> list[asyncio.Future[MessageId]]:
        return [f for segment in self._retired() for f in self._unsettled.get(segment, ())]

    def _in_transition(self) -> bool:
        return bool(self._refused) or bool(self._unsettled_on_retired())

    async def send_async(
        self,
        value: bytes,
        *,
        key: str | None = None,
        properties: dict[str, str] | None = None,
        event_time_ms: int | None = None,
        txn: Transaction | None = None,
    ) -> asyncio.Future[MessageId]:
        if txn is not None:
            await txn.add_partition(str(self.topic))
        result: asyncio.Future[MessageId] = asyncio.get_running_loop().create_future()
        if txn is not None:
            txn.track(result)
        message = _Outgoing(next(self._numbers), value, key, properties, event_time_ms, txn, result)
        if self._in_transition() or self._order.locked():
            async with self._order:  # behind everything sent before it
                await self._settle_transition()
                await self._dispatch(message)
        else:
            await self._dispatch(message)
        return result

    async def _dispatch(self, message: _Outgoing) -> None:
        segment = self.route(message.key)
        producer = await self._producer(segment)
        inner = await producer.send_async(
            message.value,
            key=message.key,
            properties=message.properties,
            event_time_ms=message.event_time_ms,
            txn=message.txn,
            registered=True,
            track=False,
        )
        self._unsettled.setdefault(segment, set()).add(inner)
        inner.add_done_callback(lambda f: self._settled(message, segment, f))

    def _settled(self, message: _Outgoing, segment: int, inner: asyncio.Future[MessageId]) -> None:
        self._unsettled[segment].discard(inner)
        if message.result.done():
            return
        if inner.cancelled():
            message.result.cancel()
            return
        error = inner.exception()
        if isinstance(error, ServerError) and error.name is ErrorName.TOPIC_TERMINATED:
            self._refused.append(message)
            if self._drainer is None or self._drainer.done():
                self._drainer = asyncio.create_task(self._drain(), name=f"reroute-{self.name}")
        elif error is not None:
            message.result.set_exception(error)
        else:
            message.result.set_result(inner.result())

    async def _drain(self) -> None:
        async with self._order:
            await self._settle_transition()

    async def _settle_transition(self) -> None:
        """(Holding ``_order``.) Wait for sends to retired segments to settle, and send the
        refused ones again, oldest first, until nothing is in transition."""
        while self._in_transition():
            unsettled = self._unsettled_on_retired()
            if unsettled:  # their _settled callbacks run before this wakes up
                await asyncio.wait(unsettled)
            refused, self._refused = sorted(self._refused, key=lambda m: m.number), []
            for message in refused:
                self.reroutes += 1
                try:
                    await self._wait_rerouted(message.key)
                    await self._dispatch(message)
                except Exception as e:  # the caller learns of it through its future
                    if not message.result.done():
                        message.result.set_exception(e)

    async def _wait_rerouted(self, key: str | None, limit_s: float = 30.0) -> None:
        """Wait until ``key`` routes to an active segment the layout knows as active (the
        push of the new DAG may come after the refusal)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        while True:
            segment = self.layout.segments.get(self.route(key))
            if segment is not None and segment.active and segment.id not in self._sealed_seen():
                return
            if loop.time() > deadline:
                raise ServerError(
                    ErrorName.TOPIC_TERMINATED, f"{self.topic}: no layout with an open segment came"
                )
            try:
                await asyncio.wait_for(self.layout.changed.wait(), 0.5)
            except TimeoutError:
                await self.layout.refresh()  # the push may be late: ask

    def _sealed_seen(self) -> set[int]:
        """Segments that refused a send, whatever the layout says yet."""
        return {segment for segment, producer in self._producers.items() if producer.refused}

    async def send(
        self,
        value: bytes,
        *,
        key: str | None = None,
        properties: dict[str, str] | None = None,
        event_time_ms: int | None = None,
        txn: Transaction | None = None,
    ) -> MessageId:
        future = await self.send_async(
            value, key=key, properties=properties, event_time_ms=event_time_ms, txn=txn
        )
        return await future

    async def flush(self) -> None:
        """Wait until every message sent so far is stored (or failed), re-sends included
        (a refused send always has a drainer running until it is sent again)."""
        while (self._drainer is not None and not self._drainer.done()) or any(
            p.pending for p in self._producers.values()
        ):
            if self._drainer is not None:
                await asyncio.gather(self._drainer, return_exceptions=True)
            await asyncio.gather(*(p.flush() for p in self._producers.values()))

    async def close(self) -> None:
        """Flush (re-sends included, for at most 30 s), then disconnect."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(30):
                await self.flush()
        if self._drainer is not None:
            self._drainer.cancel()
            await asyncio.gather(self._drainer, return_exceptions=True)
        for message in self._refused:
            if not message.result.done():
                message.result.set_exception(ClientClosed(f"producer {self.name} is closed"))
        self._refused = []
        for producer in self._producers.values():
            await producer.close()
        await self.layout.close()
