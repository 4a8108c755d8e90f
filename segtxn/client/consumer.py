"""Consumers and readers: receive with flow control, acknowledge durably, reconnect.

A :class:`Consumer` attaches to a subscription of one topic or segment. It grants the broker
``receiver_queue_size`` permits and tops them up as the application takes messages, so at
most that many messages wait in the client. ``acknowledge`` returns once the broker has
made the acknowledgment durable.

On an ordered (Exclusive or Failover) subscription, the application receives each topic's
or segment's messages in position order, and after anything hands messages back — a
transaction in which it acknowledged them does not commit, a negative ack, a reconnect, a
Failover hand-over — the broker *rewinds*: delivery starts again at the earliest
unacknowledged message and goes forward (docs/protocol.md, "Ordered redelivery"). This
client drops whatever it still had queued from before the rewind, and after its own abort
(or negative ack) it hands the application nothing more of that topic or segment until the
broker's rewind arrives. So an older message never follows a newer one except as a
redelivery (``redelivery_count`` > 0).

A scalable topic is consumed segment by segment through one queue (no ordering promise
across segments; per key, parents before children), and a :class:`Reader` reads from a
position without a subscription.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import secrets
from collections.abc import Callable
from typing import Any

import aiohttp
import msgspec

from segtxn.aio import first_completed
from segtxn.client.connection import Connector
from segtxn.client.errors import ClientClosed, ClientError, TopicEnded
from segtxn.client.layout import TopicLayout
from segtxn.client.messages import Message, MessageId
from segtxn.client.transaction import Transaction
from segtxn.protocol import frames
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.frames import (
    Ack,
    AckReceipt,
    ActiveChange,
    ConsumerReady,
    EndOfTopic,
    Error,
    Flow,
    Nack,
    Redeliver,
    Rewind,
)
from segtxn.protocol.frames import Message as MessageFrame
from segtxn.protocol.names import Domain, TopicName

log = logging.getLogger(__name__)
_ids = itertools.count(1)

FATAL = {
    ErrorName.TOPIC_NOT_FOUND,
    ErrorName.INVALID_TOPIC_NAME,
    ErrorName.NOT_ALLOWED,
    ErrorName.CONSUMER_BUSY,
    ErrorName.INVALID_ARGUMENT,
    ErrorName.SUBSCRIPTION_NOT_FOUND,
}


class _Stream:
    """One WebSocket of messages from a broker, reconnecting; shared by consumer and reader.

    A consumer's stream drops its undelivered messages on reconnect, on a ``Rewind`` and when
    it stops being the active Failover member (the broker delivers them again); while a
    redelivery it asked for is not yet answered, it drops arriving messages too (they were
    sent before the rewind). A reader's stream keeps them and resumes after the last one it
    received.
    """

    def __init__(
        self,
        connector: Connector,
        topic: TopicName,
        *,
        kind: str,
        suffix: str,
        query: dict[str, str],
        receiver_queue_size: int,
        deliver: asyncio.Queue[Message | BaseException],
        on_end: Callable[[], None] | None = None,
        ordered: bool = False,
    ) -> None:
        self.topic = topic
        self._ordered = ordered
        self._connector = connector
        self._kind, self._suffix, self._query = kind, suffix, query
        self._size = receiver_queue_size
        self._deliver = deliver
        self._on_end = on_end
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._acks: dict[int, asyncio.Future[None]] = {}
        self._ack_frames: dict[int, Ack] = {}
        self._granted = 0
        self._awaiting: set[int] = set()
        """Redeliver / Nack requests whose Rewind has not come: messages arriving meanwhile
        were sent before the rewind and are dropped."""
        self.epoch = 0
        self.active = True
        self.ended = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.reconnects = 0

    async def start(self) -> None:
        ws = await self._connect()
        self._task = asyncio.create_task(self._run(ws), name=f"{self._kind}-{self.topic}")

    async def _connect(self) -> aiohttp.ClientWebSocketResponse:
        broker = await self._connector.broker_for(self.topic)
        ws = await self._connector.websocket(
            broker, self._kind, self.topic, self._suffix, self._query
        )
        if self._kind == "consumer":
            message = await ws.receive()
            ready = (
                frames.server_frame.decode(message.data)
                if message.type is aiohttp.WSMsgType.BINARY
                else None
            )
            if not isinstance(ready, ConsumerReady):
                await ws.close()
                raise ServerError(ErrorName.SERVICE_NOT_READY, "the broker did not accept us")
            self.active = ready.active
            self.epoch = ready.epoch
        self._awaiting.clear()  # a new attachment: the broker starts it from a rewind
        self._ws = ws
        self._granted = self._size
        await ws.send_bytes(frames.encode(Flow(permits=self._size)))
        for frame in self._ack_frames.values():  # acks whose receipts never came
            await ws.send_bytes(frames.encode(frame))
        return ws

    async def _run(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        delay = 0.05
        while True:
            try:
                await self._read(ws)
            except (aiohttp.ClientError, ConnectionError) as e:
                log.info("%s on %s lost its connection: %s", self._kind, self.topic, e)
            finally:
                self._ws = None
                await ws.close()
            if self._kind == "consumer":
                self._drop_queued()
            while True:
                await asyncio.sleep(delay)
                try:
                    ws = await self._connect()
                    self.reconnects += 1
                    delay = 0.05
                    break
                except ServerError as e:
                    if e.name in FATAL:
                        self._deliver.put_nowait(e)
                        return
                    delay = min(delay * 2, 2.0)

    def _drop_queued(self) -> int:
        """Messages not yet taken will be redelivered: drop ours so none is seen twice.
        Returns how many were dropped."""
        kept: list[Message | BaseException] = []
        dropped = 0
        while not self._deliver.empty():
            item = self._deliver.get_nowait()
            if isinstance(item, Message) and item.message_id.topic == str(self.topic):
                dropped += 1
                continue
            kept.append(item)
        for item in kept:
            self._deliver.put_nowait(item)
        return dropped

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for raw in ws:
            if raw.type is not aiohttp.WSMsgType.BINARY:
                continue
            try:
                frame = frames.server_frame.decode(raw.data)
            except msgspec.DecodeError:
                log.warning("undecodable frame from the broker on %s", self.topic)
                continue
            if isinstance(frame, MessageFrame):
                if self._awaiting:  # sent before the rewind we asked for: it comes again
                    await self.taken()
                    continue
                self._deliver.put_nowait(_message(self.topic, frame))
                if self._kind == "reader":  # after a reconnect, go on after this one
                    ledger, entry = frame.message_id
                    self._query["start"] = f"{ledger}:{entry + 1}"
            elif isinstance(frame, AckReceipt):
                self._ack_frames.pop(frame.request_id, None)
                future = self._acks.pop(frame.request_id, None)
                if future is not None and not future.done():
                    future.set_result(None)
            elif isinstance(frame, Error):
                error = ServerError(ErrorName(frame.error), frame.message)
                if frame.request_id:
                    self._ack_frames.pop(frame.request_id, None)
                    future = self._acks.pop(frame.request_id, None)
                    if future is not None and not future.done():
                        future.set_exception(error)
                else:
                    log.warning("%s on %s: %s", self._kind, self.topic, error)
            elif isinstance(frame, ActiveChange):
                self.active = frame.active
                if not frame.active:
                    # the broker gives what we had not acked to the new active member: the
                    # ones still queued here must not reach the application too
                    await self._drop_and_regrant()
            elif isinstance(frame, Rewind):
                self.epoch = frame.epoch
                self._awaiting.discard(frame.request_id)
                dropped = await self._drop_and_regrant()
                log.debug(
                    "%s on %s: rewind to epoch %d (%d queued dropped)",
                    self._kind,
                    self.topic,
                    frame.epoch,
                    dropped,
                )
            elif isinstance(frame, EndOfTopic):
                self.ended.set()
                if self._on_end is not None:
                    self._on_end()
        raise ConnectionError("the broker closed the connection")

    async def _drop_and_regrant(self) -> int:
        """Drop the queued messages (they come again); their permits were spent on the
        link, so grant them again. Returns how many were dropped."""
        dropped = self._drop_queued()
        if dropped and self._ws is not None:
            await self._ws.send_bytes(frames.encode(Flow(permits=dropped)))
        return dropped

    async def redeliver(self, txn: tuple[int, int] | None = None) -> None:
        """Ask for every unacknowledged message again, once ``txn`` (if given) has let go
        of its acks (after it did not commit); until the broker's Rewind answers, nothing
        more of this stream reaches the application."""
        await self._ask_again(Redeliver(request_id=next(_ids), txn=txn))

    async def _ask_again(self, frame: Redeliver | Nack) -> None:
        if self._ws is None:
            return  # reconnecting: the new attachment starts from a rewind anyway
        self._awaiting.add(frame.request_id)
        await self._drop_and_regrant()
        await self._ws.send_bytes(frames.encode(frame))

    async def taken(self) -> None:
        """One message was handed to the application: top permits up in halves."""
        self._granted -= 1
        if self._granted <= self._size // 2 and self._ws is not None:
            more = self._size - self._granted
            self._granted = self._size
            await self._ws.send_bytes(frames.encode(Flow(permits=more)))

    async def ack(
        self,
        ids: list[MessageId],
        *,
        cumulative: bool,
        txn: tuple[int, int] | None = None,
        epoch: int | None = None,
    ) -> None:
        request_id = next(_ids)
        frame = Ack(
            message_ids=[(i.ledger_id, i.entry_id) for i in ids],
            cumulative=cumulative,
            request_id=request_id,
            txn=txn,
            epoch=epoch,
        )
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._acks[request_id] = future
        self._ack_frames[request_id] = frame
        if self._ws is not None:
            await self._ws.send_bytes(frames.encode(frame))
        await future  # sent again after a reconnect, until the broker confirms

    async def nack(self, ids: list[MessageId]) -> None:
        """Ask for these again; on an ordered subscription the broker rewinds and nothing
        newer reaches the application before they do."""
        positions = [(i.ledger_id, i.entry_id) for i in ids]
        if self._ordered:
            await self._ask_again(Nack(message_ids=positions, request_id=next(_ids)))
        elif self._ws is not None:
            await self._ws.send_bytes(frames.encode(Nack(message_ids=positions)))

    async def settle_acks(self, limit_s: float) -> None:
        """Wait, at most ``limit_s``, for the acks in flight to be confirmed."""
        waiting = [future for future in self._acks.values() if not future.done()]
        if waiting:
            await asyncio.wait(waiting, timeout=limit_s)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._ws is not None:
            await self._ws.close()
        for future in self._acks.values():
            if not future.done():
                future.set_exception(ClientClosed("closed before the ack was confirmed"))


def _message(topic: TopicName, frame: MessageFrame) -> Message:
    return Message(
        message_id=MessageId(str(topic), *frame.message_id),
        value=frame.payload,
        key=frame.key,
        properties=frame.properties,
        publish_time_ms=frame.publish_time_ms,
        event_time_ms=frame.event_time_ms,
        producer_name=frame.producer_name,
        sequence_id=frame.sequence_id,
        redelivery_count=frame.redelivery_count,
        epoch=frame.epoch,
    )


MAX_STREAMS = 257  # a topic's segments over its whole life: bounds the local queue
ACK_SETTLE_S = 10.0  # how long a finished segment waits for its last acks to be confirmed


class Consumer:
    """Messages of one subscription, from one topic, or from a scalable topic's segments.

    For a scalable topic it follows the segment DAG (a lookup session). With Exclusive or
    Failover (ordered) subscriptions a segment is consumed only after every one of its
    parents has been consumed *and acknowledged* to its end (the broker says so with
    ``end_of_topic``), so each key's messages arrive in order across splits and merges.
    With Shared every segment is consumed as soon as it exists, in no particular order.

    Ordered subscriptions also promise this within each topic or segment: messages arrive
    in position order, and after messages are handed back (a transaction that acknowledged
    them did not commit, a negative ack, a reconnect, a Failover hand-over) they arrive
    again from the earliest unacknowledged one, in order; an older message never follows a
    newer one except as a redelivery (``redelivery_count`` > 0). After ``txn.abort()`` (or a
    failed commit) returns, nothing newer than the transaction's inputs is handed out until
    they have come back. A transaction may only acknowledge a message received since the
    latest rewind (else ``TransactionConflict``: abort and take it again).
    """

    def __init__(
        self,
        connector: Connector,
        topic: TopicName,
        subscription: str,
        *,
        sub_type: str = "Exclusive",
        initial: str = "latest",
        name: str | None = None,
        receiver_queue_size: int = 1000,
        layout: TopicLayout | None = None,
    ) -> None:
        self.subscription = subscription
        # unique across processes: a Failover member's place is held by name
        self.name = name or f"consumer-{next(_ids)}-{secrets.token_hex(4)}"
        self.topic = topic
        self._connector = connector
        self._layout = layout
        self._ordered = sub_type != "Shared"
        self._size = receiver_queue_size
        self._query = {"type": sub_type, "initial": initial, "name": self.name}
        self._queue: asyncio.Queue[Message | BaseException] = asyncio.Queue(
            maxsize=(receiver_queue_size + 8) * (MAX_STREAMS if layout else 1)
        )
        self._streams: dict[str, _Stream] = {}
        self._finished: set[int] = set()
        """Segments consumed and acknowledged to their end (their streams are closed)."""
        self._wake = asyncio.Event()
        self._follower: asyncio.Task[None] | None = None
        self._closed = False

    def _stream(self, message_id: MessageId) -> _Stream:
        stream = self._streams.get(message_id.topic)
        if stream is None:
            raise ValueError(f"{message_id} is not from a segment this consumer reads now")
        return stream

    def _new_stream(self, topic: TopicName) -> _Stream:
        return _Stream(
            self._connector,
            topic,
            kind="consumer",
            suffix=f"/{self.subscription}",
            query=self._query,
            receiver_queue_size=self._size,
            deliver=self._queue,
            on_end=self._wake.set,
            ordered=self._ordered,
        )

    async def _open(self, topic: TopicName) -> None:
        stream = self._new_stream(topic)
        await stream.start()
        self._streams[str(topic)] = stream

    async def start(self) -> None:
        try:
            if self._layout is None:
                await self._open(self.topic)
                return
            await self._open_eligible()
            self._follower = asyncio.create_task(self._follow(), name=f"consumer-dag-{self.name}")
        except BaseException:
            await self.close()
            raise

    async def _open_eligible(self) -> None:
        assert self._layout is not None
        for segment in sorted(self._layout.segments.values(), key=lambda s: s.id):
            name = self.topic.segment_name(segment.id)
            if str(name) in self._streams or segment.id in self._finished:
                continue
            if self._ordered and not all(p in self._finished for p in segment.parents):
                continue  # its parents first: per-key order
            await self._open(name)

    async def _follow(self) -> None:
        """Open segments as the DAG grows and as parents finish; close finished ones."""
        assert self._layout is not None
        while True:
            await first_completed(
                self._layout.changed.wait(), self._wake.wait(), name=f"consumer-dag-{self.name}"
            )
            self._wake.clear()
            for key, stream in list(self._streams.items()):
                if stream.ended.is_set() and self._ordered:
                    self._finished.add(TopicName.parse(key).segment or 0)
                    del self._streams[key]
                    await stream.settle_acks(ACK_SETTLE_S)  # its last acks' receipts
                    await stream.close()
            await self._open_eligible()

    @property
    def active(self) -> bool:
        """False while this is a Failover standby on every stream."""
        return any(s.active for s in self._streams.values())

    def ended(self) -> bool:
        """True once every stream's topic is sealed and fully consumed."""
        return all(s.ended.is_set() for s in self._streams.values())

    async def receive(self, timeout_s: float | None = None) -> Message:
        """The next message.

        Raises:
            TimeoutError: none arrived within ``timeout_s``.
            ServerError: the subscription became unusable (e.g. the topic was deleted).
        """
        if self._closed:
            raise ClientClosed("the consumer is closed")
        async with asyncio.timeout(timeout_s):
            item = await self._queue.get()
        if isinstance(item, BaseException):
            raise item
        stream = self._streams.get(item.message_id.topic)
        if stream is not None:
            await stream.taken()
        return item

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.receive()
        except ClientClosed:
            raise StopAsyncIteration from None

    async def acknowledge(
        self, message: Message | MessageId, *, txn: Transaction | None = None
    ) -> None:
        """Acknowledge one message; returns once the broker made it durable (in ``txn``:
        held by the transaction, applied if it commits, released if it aborts).

        Raises:
            ServerError: e.g. TransactionConflict when another open transaction holds it.
        """
        await self._ack(message, cumulative=False, txn=txn)

    async def acknowledge_cumulative(
        self, message: Message | MessageId, *, txn: Transaction | None = None
    ) -> None:
        """Acknowledge this message and every earlier one of its topic/segment."""
        await self._ack(message, cumulative=True, txn=txn)

    async def _ack(
        self, message: Message | MessageId, *, cumulative: bool, txn: Transaction | None
    ) -> None:
        message_id = message.message_id if isinstance(message, Message) else message
        stream = self._stream(message_id)
        if txn is None:
            await stream.ack([message_id], cumulative=cumulative)
            return
        # one registration per scalable topic, not per segment (v5 treats it as a no-op
        # beyond the domain check, so its segments share it)
        name = TopicName.parse(message_id.topic)
        registered = name.parent() if name.domain is Domain.SEGMENT else name
        await txn.add_subscription(str(registered), self.subscription)
        # if the transaction does not commit, what it acknowledged here comes again first
        txn.on_failure(stream, functools.partial(stream.redeliver, txn.wire_id))
        ack = asyncio.ensure_future(
            stream.ack(
                [message_id],
                cumulative=cumulative,
                txn=txn.wire_id,
                epoch=message.epoch if isinstance(message, Message) else None,
            )
        )
        txn.track(ack)
        await ack

    async def negative_acknowledge(self, message: Message | MessageId) -> None:
        """Ask for this message to be delivered again."""
        message_id = message.message_id if isinstance(message, Message) else message
        await self._stream(message_id).nack([message_id])

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._follower is not None:
            self._follower.cancel()
            await asyncio.gather(self._follower, return_exceptions=True)
        for stream in self._streams.values():
            await stream.close()
        if self._layout is not None:
            await self._layout.close()


class Reader:
    """Messages of one topic or segment from a start position, without a subscription."""

    def __init__(
        self,
        connector: Connector,
        topic: TopicName,
        *,
        start: str = "earliest",
        end: str | None = None,
        receiver_queue_size: int = 1000,
    ) -> None:
        self._queue: asyncio.Queue[Message | BaseException] = asyncio.Queue(
            maxsize=receiver_queue_size + 8
        )
        query = {"start": start} if end is None else {"start": start, "end": end}
        self._stream = _Stream(
            connector,
            topic,
            kind="reader",
            suffix="",
            query=query,
            receiver_queue_size=receiver_queue_size,
            deliver=self._queue,
            on_end=self._ended,
        )

    def _ended(self) -> None:
        # after every message (one WebSocket, in order); kept across reconnects like errors
        self._queue.put_nowait(TopicEnded(f"{self._stream.topic}: nothing more to read"))

    async def start(self) -> None:
        await self._stream.start()

    def ended(self) -> bool:
        return self._stream.ended.is_set()

    async def receive(self, timeout_s: float | None = None) -> Message:
        """The next message.

        Raises:
            TopicEnded: everything was read (sealed topic, or past ``end``); raised again on
                every later call.
        """
        async with asyncio.timeout(timeout_s):
            item = await self._queue.get()
        if isinstance(item, TopicEnded):
            self._queue.put_nowait(item)  # it stays the end
            raise item
        if isinstance(item, BaseException):
            raise item
        await self._stream.taken()
        return item

    async def close(self) -> None:
        await self._stream.close()


class CheckpointConsumer(Consumer):
    """Reads a scalable topic with positions held by the application, not the broker.

    Segments are read in DAG order (a child after its parents are read to their end), with
    readers: nothing is acknowledged. :meth:`checkpoint` returns a JSON-serializable dict of
    where every segment is; a consumer created with it resumes there — after splits and
    merges too: segments finished stay finished, new ones start at their beginning.
    Delivery is at least once from a checkpoint (messages received after it come again).
    """

    def __init__(
        self,
        connector: Connector,
        topic: TopicName,
        layout: TopicLayout,
        checkpoint: dict[str, Any] | None = None,
        *,
        receiver_queue_size: int = 1000,
    ) -> None:
        super().__init__(
            connector,
            topic,
            "checkpoint",
            sub_type="Exclusive",
            receiver_queue_size=receiver_queue_size,
            layout=layout,
        )
        saved = checkpoint or {}
        self._positions: dict[int, str] = {int(k): v for k, v in saved.get("next", {}).items()}
        self._finished = {int(s) for s in saved.get("finished", [])}

    def _new_stream(self, topic: TopicName) -> _Stream:
        start = self._positions.get(topic.segment or 0, "earliest")
        return _Stream(
            self._connector,
            topic,
            kind="reader",
            suffix="",
            query={"start": start},
            receiver_queue_size=self._size,
            deliver=self._queue,
            on_end=self._wake.set,
        )

    async def receive(self, timeout_s: float | None = None) -> Message:
        message = await super().receive(timeout_s)
        segment = TopicName.parse(message.message_id.topic).segment or 0
        self._positions[segment] = (
            f"{message.message_id.ledger_id}:{message.message_id.entry_id + 1}"
        )
        return message

    def checkpoint(self) -> dict[str, Any]:
        """Where reading stands: ``{"next": {segment: "L:E"}, "finished": [segment, ...]}``."""
        return {
            "next": {str(k): v for k, v in sorted(self._positions.items())},
            "finished": sorted(self._finished),
        }

    async def acknowledge(
        self, message: Message | MessageId, *, txn: Transaction | None = None
    ) -> None:
        raise ClientError("a checkpoint consumer acknowledges nothing: keep its checkpoint()")
