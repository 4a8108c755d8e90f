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
the segment DAG (which segments are read, and when) in :mod:`segtxn.client.segments`.

Time limits: ``receive`` waits as long as it takes unless given ``timeout_s`` (closing the
consumer ends it at once: ClientClosed); an acknowledgment, a negative ack and a redelivery
request end within the client's operation timeout (or their ``timeout_s``); attaching
retries a broker that is down or restarting until the operation timeout. A segment that
appears later and cannot be attached yet is tried again in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import secrets
from collections.abc import Awaitable

from segtxn import tracing
from segtxn.client.closables import Closable
from segtxn.client.connection import Connector
from segtxn.client.errors import ClientClosed, Timeout
from segtxn.client.layout import TopicLayout
from segtxn.client.messages import Message, MessageId
from segtxn.client.poisoning import poisons
from segtxn.client.queues import close_queue, next_item
from segtxn.client.segments import SegmentFollowing
from segtxn.client.spans import ack_span
from segtxn.client.stream import MessageStream
from segtxn.client.timeouts import Deadline, close_quietly, retrying
from segtxn.client.transaction import Transaction
from segtxn.protocol.errors import ConsumerBusy, ErrorCategory, TransactionConflict
from segtxn.protocol.names import Domain, TopicName
from segtxn.protocol.txnops import ack_op

__all__ = ["Consumer"]

log = logging.getLogger(__name__)
_ids = itertools.count(1)

MAX_STREAMS = 257  # a topic's segments over its whole life: bounds the local queue


class Consumer(SegmentFollowing, Closable):
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

    def _message_id(self, message: Message | MessageId) -> MessageId:
        """The id of a message this consumer may acknowledge.

        Raises:
            TypeError: anything but a Message or a MessageId (an application's own record
                of one, None): an AttributeError from deep inside said nothing useful.
            ValueError: a Message another subscription delivered (acknowledged here, it
                would count as consumed in this subscription, which may never have had it).
        """
        message_id = message.message_id if isinstance(message, Message) else message
        if not isinstance(message_id, MessageId):
            raise TypeError(
                "a Message (or its message_id) received from this consumer, not "
                f"{type(message).__name__}"
            )
        if isinstance(message, Message) and message.subscription not in (None, self.subscription):
            raise ValueError(
                f"{message_id} was delivered to subscription {message.subscription!r}, not "
                f"{self.subscription!r}: acknowledge it with a consumer of that subscription"
            )
        return message_id

    def _stream(self, message_id: MessageId) -> MessageStream | None:
        """The stream ``message_id`` came on, or None when its segment was consumed to its
        end (sealed, and every message of it acknowledged by the subscription: its stream is
        closed). That happens to a message the application still held while another
        consumer took the segment over and finished it (a Failover hand-over)."""
        stream = self._streams.get(message_id.topic)
        if stream is not None:
            return stream
        name = TopicName.parse(message_id.topic)
        if (
            name.domain is Domain.SEGMENT
            and name.parent() == self.topic
            and self._layout is not None
            and ((name.segment or 0) in self._finished or self._layout.pruned(name.segment or 0))
        ):
            return None
        raise ValueError(f"{message_id} is not from a segment this consumer reads now")

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
            TypeError / ValueError: ``timeout_s`` is not None or a finite number >= 0.
            ClientClosed: the consumer was closed, before the call or while it waited
                (``async for`` then ends).
        """
        self._check_open()
        item = await next_item(self._queue, timeout_s, f"consumer {self.name}")
        self._check_open()  # closed while a message was on its way to this receive
        if isinstance(item, BaseException):
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

    async def acknowledge(
        self,
        message: Message | MessageId,
        *,
        txn: Transaction | None = None,
        timeout_s: float | None = None,
    ) -> None:
        """Acknowledge one message; returns once the broker made it durable (in ``txn``:
        held by the transaction, applied if it commits, released if it aborts).

        Args:
            timeout_s: limit of the whole call, registration with ``txn`` included
                (default: the client's operation timeout).

        A message whose segment was consumed to its end meanwhile (another Failover member
        took the segment over and finished it) is acknowledged already: without ``txn`` this
        returns at once; in ``txn`` it is a TransactionConflict.

        Raises:
            ServerError: e.g. TransactionConflict when another open transaction holds it.
                Without ``txn``, ServiceNotReady (the broker could not save it to its
                store) may still have taken effect: the message may or may not be delivered
                again; acknowledging it again is harmless (docs/protocol.md).
            Timeout: no receipt in time (OUTCOME_UNKNOWN: it may have been applied; in
                ``txn`` the transaction can no longer commit).
            ConnectionLost: the connection was lost and the broker could not be reached
                again, at once rather than at the timeout (OUTCOME_UNKNOWN if it was
                written: it may have been applied; RETRIABLE if it was not). A connection
                lost and attached again at once fails nothing: the ack is sent again.
            ClientClosed: the consumer was closed (nothing was sent), or closed before the
                receipt came (it may have been applied).
            TransactionEnded: ``txn`` has ended (committed, or aborted, perhaps by an
                ``abort()`` that stopped waiting while this registered): nothing was sent.
            ValueError: the message is not from this consumer's topic, or another
                subscription delivered it.
            TypeError: ``message`` is not a Message or MessageId, or ``txn`` not a
                Transaction.

        In ``txn``, anything this raises dooms the transaction: its commit aborts and
        raises TransactionFailed from it (cancelling the call: from OperationCancelled).
        """
        with poisons(txn):
            await self._ack(message, cumulative=False, txn=txn, timeout_s=timeout_s)

    async def acknowledge_cumulative(
        self,
        message: Message | MessageId,
        *,
        txn: Transaction | None = None,
        timeout_s: float | None = None,
    ) -> None:
        """Acknowledge this message and every earlier one of its topic/segment (as
        :meth:`acknowledge`)."""
        with poisons(txn):
            await self._ack(message, cumulative=True, txn=txn, timeout_s=timeout_s)

    def _deadline(self, timeout_s: float | None) -> Deadline:
        return Deadline(self._connector.timeouts.limit(timeout_s))

    async def acknowledge_async(
        self,
        message: Message | MessageId,
        *,
        txn: Transaction | None = None,
        timeout_s: float | None = None,
    ) -> asyncio.Future[None]:
        """Queue one acknowledgment (as :meth:`acknowledge`) and return at once with a future
        that is done when the broker made it durable, or fails as :meth:`acknowledge` raises.
        Acks queued one after the other travel in one frame, so a batch costs one request
        and, in a transaction, one record, however many messages it holds.

        In ``txn`` the commit waits for these futures and aborts if one failed (raising
        TransactionFailed from its error): a loop may queue a batch's sends
        (``send_async``) and acks and then commit, awaiting none of them. This call itself
        raises only what happens before the ack is queued (the transaction could not be
        joined, a message of another topic, the consumer closed). Without ``txn``, await
        the future (or read its result) as with any asyncio future: a failure nobody
        retrieves is logged by asyncio when the future is discarded.
        """
        with poisons(txn):
            return await self._submit(message, cumulative=False, txn=txn, timeout_s=timeout_s)

    async def _ack(
        self,
        message: Message | MessageId,
        *,
        cumulative: bool,
        txn: Transaction | None,
        timeout_s: float | None,
    ) -> None:
        await (await self._submit(message, cumulative=cumulative, txn=txn, timeout_s=timeout_s))

    async def _submit(
        self,
        message: Message | MessageId,
        *,
        cumulative: bool,
        txn: Transaction | None,
        timeout_s: float | None,
    ) -> asyncio.Future[None]:
        """Queue one ack on its stream; the future is its answer (in ``txn``: tracked by
        the transaction)."""
        self._check_open()
        deadline = self._deadline(timeout_s)
        message_id = self._message_id(message)
        stream = self._stream(message_id)
        if stream is None:  # its segment is consumed to its end: it is acknowledged already
            if txn is None:
                done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                done.set_result(None)
                return done
            error = TransactionConflict(
                f"{message_id}: its segment was consumed to its end by the subscription (another "
                "consumer acknowledged it), so this transaction cannot hold it: abort it",
            )
            txn.operations.poison(error)
            raise error
        if txn is None:
            span = ack_span(message_id, cumulative, None)
            plain = stream.ack(
                [message_id],
                cumulative=cumulative,
                deadline=deadline,
                traceparent=tracing.traceparent(span),
            )
            tracing.end_when_done(span, plain)
            return plain
        # one registration per scalable topic, not per segment (v5 treats it as a no-op
        # beyond the domain check, so its segments share it)
        await txn.add_subscription(_registered(message_id.topic), self.subscription, deadline)
        self._check_open()  # closed while it registered: its stream writes nothing any more
        # if the transaction does not commit, everything not acknowledged comes again, in
        # order, on every stream: what it acknowledged, and what the application had taken
        # for it and not reached (a batch spans segments)
        txn.operations.on_failure(self, functools.partial(self._redeliver_all, txn.wire_id))
        span = ack_span(message_id, cumulative, txn)
        name = ack_op(
            message_id.topic,
            self.subscription,
            (message_id.ledger_id, message_id.entry_id),
            cumulative,
        )
        ack = stream.ack(
            [message_id],
            cumulative=cumulative,
            txn=txn.wire_id,
            epoch=message.epoch if isinstance(message, Message) else None,
            deadline=deadline,
            traceparent=tracing.traceparent(span),
            placed=functools.partial(_placed, txn, name),
        )
        tracing.end_when_done(span, ack)
        txn.operations.track(ack)
        return ack

    async def _redeliver_all(self, txn: tuple[int, int]) -> None:
        for stream in list(self._streams.values()):
            deadline = self._deadline(None)  # each stream's request its own limit
            await self._bounded(stream.redeliver(txn), deadline, "redeliver")

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

    async def _bounded(self, call: Awaitable[None], deadline: Deadline, what: str) -> None:
        try:
            async with deadline.timeout():
                await call
        except TimeoutError as e:
            raise Timeout(
                f"consumer {self.name}: {what} not sent within {deadline}",
                category=ErrorCategory.RETRIABLE,
            ) from e

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


@functools.lru_cache(maxsize=1024)
def _registered(topic: str) -> str:
    """The name a transaction registers a subscription of ``topic`` under: a segment's
    scalable topic (cached: it was parsed again for every transactional ack)."""
    name = TopicName.parse(topic)
    return str(name.parent() if name.domain is Domain.SEGMENT else name)


def _placed(txn: Transaction, name: str, future: asyncio.Future[None], broker_url: str) -> None:
    """An ack of ``txn`` named ``name`` is being written to ``broker_url``."""
    placements = txn.placements
    if placements is not None:
        placements.placed(future, broker_url, name)
