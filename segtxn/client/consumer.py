"""Consumers: receive with flow control, acknowledge durably, reconnect, keep order.

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
across segments; per key, parents before children); a
:class:`~segtxn.client.checkpoint.CheckpointConsumer` reads it with positions the
application keeps. The per-connection work is in :mod:`segtxn.client.stream`; following
the segment DAG (which segments are read, and when) in :mod:`segtxn.client.segments`;
acknowledging (alone or in a transaction) in :mod:`segtxn.client.acknowledging`. This
module is the consumer's attaching, receiving, asking for messages again, and closing.

Time limits: ``receive`` waits as long as it takes unless given ``timeout_s`` (closing the
consumer ends it at once: ClientClosed); an acknowledgment, a negative ack and a redelivery
request end within the client's operation timeout (or their ``timeout_s``); attaching
retries a broker that is down or restarting until the operation timeout. A segment that
appears later and cannot be attached yet is tried again in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets

from segtxn.client.acknowledging import Acknowledging
from segtxn.client.closables import Closable
from segtxn.client.connection import Connector
from segtxn.client.errors import ClientClosed
from segtxn.client.layout import TopicLayout
from segtxn.client.messages import Message, MessageId
from segtxn.client.queues import close_queue, next_item
from segtxn.client.segments import SegmentFollowing
from segtxn.client.stream import MessageStream
from segtxn.client.timeouts import Deadline, close_quietly, retrying
from segtxn.protocol.errors import ConsumerBusy
from segtxn.protocol.names import TopicName

__all__ = ["Consumer"]

log = logging.getLogger(__name__)
_ids = itertools.count(1)

MAX_STREAMS = 257  # a topic's segments over its whole life: bounds the local queue


class Consumer(Acknowledging, SegmentFollowing, Closable):
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
    latest rewind, and in order: not past one received and left unacknowledged (else
    ``TransactionConflict``: abort and take them again). Its acks need not be awaited one
    at a time: :meth:`acknowledge_async` queues them, and the commit waits for them.
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
        self._streams: dict[str, MessageStream] = {}
        self._finished: set[int] = set()
        """Segments consumed and acknowledged to their end (their streams are closed)."""
        self._wake = asyncio.Event()
        self._follower: asyncio.Task[None] | None = None
        self._closed = False

    def _new_stream(self, topic: TopicName) -> MessageStream:
        return MessageStream(
            self._connector,
            topic,
            kind="consumer",
            suffix=f"/{self.subscription}",
            query=self._query,
            receiver_queue_size=self._size,
            deliver=self._queue,
            on_end=self._wake.set,
            ordered=self._ordered,
            subscription=self.subscription,
        )

    async def _touch(self, topic: TopicName, deadline: Deadline) -> None:
        async def attach_and_leave() -> None:
            broker = await self._connector.broker_for(topic)
            ws, _ = await self._connector.websocket_at(
                broker, "consumer", topic, f"/{self.subscription}", self._query
            )
            try:
                await ws.receive()  # its consumer_ready: attached, so the subscription exists
            finally:
                await close_quietly(ws.close())

        with contextlib.suppress(ConsumerBusy):  # another consumer is attached there: it exists
            await retrying(
                f"create subscription {self.subscription} on {topic}",
                attach_and_leave,
                deadline,
                request_timeout_s=self._connector.timeouts.request_timeout_s,
            )

    async def _open(self, topic: TopicName, deadline: Deadline) -> None:
        stream = self._new_stream(topic)
        await stream.start(deadline)
        self._streams[str(topic)] = stream

    async def start(self, deadline: Deadline) -> None:
        """Attach to the topic (every eligible segment), retrying until ``deadline``.

        Raises:
            ServerError: the broker refused (TopicNotFound, ConsumerBusy, ...).
            Timeout: not attached by ``deadline``.
        """
        try:
            if self._layout is None:
                await self._open(self.topic, deadline)
                return
            await self._open_eligible(deadline)
            if self._ordered and self._query["initial"] == "latest":
                await self._create_ahead(deadline)
            self._follower = asyncio.create_task(self._follow(), name=f"consumer-dag-{self.name}")
        except BaseException:
            await self.close()
            raise

    @property
    def active(self) -> bool:
        """False while this is a Failover standby on every stream."""
        return any(s.active for s in self._streams.values())

    def reconnecting(self) -> list[str]:
        """The topics or segments it is reconnecting to now (their brokers unreachable or
        refusing): a ``receive`` that times out may have missed their messages."""
        return [name for name, s in self._streams.items() if not s.attached]

    def ended(self) -> bool:
        """True once every stream's topic is sealed and fully consumed."""
        return all(s.ended.is_set() for s in self._streams.values())

    async def receive(self, timeout_s: float | None = None) -> Message:
        """The next message.

        Args:
            timeout_s: how long to wait for one: None (the default) as long as it takes; 0
                only for one already here; else a finite number of seconds.

        Raises:
            Timeout: none arrived within ``timeout_s`` (RETRIABLE; also a TimeoutError).
            ServerError: the subscription became unusable (e.g. the topic was deleted).
            CertificateError: reconnecting met a broker certificate the client does not
                trust (it does not retry). Once every stream of the consumer (one, on a
                ``persistent://`` topic) has ended so, or with a ServerError, every later
                call raises it again.
            TypeError / ValueError: ``timeout_s`` is not None or a finite number >= 0.
            ClientClosed: the consumer was closed, before the call or while it waited
                (``async for`` then ends).
        """
        self._check_open()
        item = await next_item(self._queue, timeout_s, f"consumer {self.name}")
        self._check_open()  # closed while a message was on its way to this receive
        if isinstance(item, BaseException):
            if self._streams and all(s.failed is not None for s in self._streams.values()):
                # every stream ended for good: nothing can arrive any more, so every later
                # receive raises it too rather than waiting for nothing
                self._queue.put_nowait(item)
            raise item
        stream = self._streams.get(item.message_id.topic)
        if stream is not None:
            await stream.taken()
        return item

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed(f"consumer {self.name} is closed")

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.receive()
        except ClientClosed:
            raise StopAsyncIteration from None

    async def redeliver_unacknowledged(self, *, timeout_s: float | None = None) -> None:
        """Have every message received and not acknowledged delivered again (Pulsar's
        ``redeliverUnacknowledgedMessages``): on an ordered subscription from the earliest,
        in order, and nothing newer is handed out before it. For when processing failed
        before the messages could be acknowledged (a transaction that could not start).

        Raises:
            Timeout: the requests (one per topic or segment) were not all written within
                ``timeout_s`` (default: the operation timeout); they are written later
                anyway (the stream owns them), and a reconnect redelivers them too.
            ClientClosed: the consumer was closed.
        """
        self._check_open()
        deadline = self._deadline(timeout_s)
        for stream in list(self._streams.values()):
            await self._bounded(stream.redeliver(), deadline, "redeliver")

    async def negative_acknowledge(
        self, message: Message | MessageId, *, timeout_s: float | None = None
    ) -> None:
        """Ask for this message to be delivered again (returns once asked, not when it
        comes back).

        On an ordered subscription the broker answers with a rewind; if it refuses
        instead (an id the topic never held), the consumer attaches again, which rewinds
        just the same. Nothing is taken back when the caller gives up.

        Raises:
            Timeout: the request was not written within ``timeout_s`` (default: the
                operation timeout); it is written later anyway.
            ClientClosed: the consumer was closed.
        """
        self._check_open()
        deadline = self._deadline(timeout_s)
        message_id = self._message_id(message)
        stream = self._stream(message_id)
        if stream is not None:  # else its segment is consumed to its end: nothing comes again
            await self._bounded(stream.nack([message_id]), deadline, "nack")

    async def close(self) -> None:
        """Detach from every stream (at most 1 s per socket); a ``receive`` waiting raises
        ClientClosed at once, and acknowledgments not yet confirmed fail with it.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        close_queue(self._queue, ClientClosed(f"consumer {self.name} is closed"))
        if self._follower is not None:
            self._follower.cancel()
            await asyncio.gather(self._follower, return_exceptions=True)
        await asyncio.gather(*(stream.close() for stream in self._streams.values()))
        if self._layout is not None:
            await self._layout.close()
        self._close_done()
