"""The producer of a scalable topic: routes keys to segments, and keeps each key's order
across splits and merges.

A :class:`ScalableProducer` routes keyed messages of a ``topic://`` to the active segment
whose hash range covers the key (unkeyed ones go round-robin), one
:class:`~segtxn.client.producer.Producer` per segment, opened on the first message for it.
A send ends within ``send_timeout_s`` of the call whatever happens underneath (a segment's
producer being created, a re-send after a seal): its future then fails with ``Timeout`` and
the message is not sent again. Once :meth:`~ScalableProducer.close` has begun, a send raises
``ClientClosed`` and nothing is stored, as with a ``persistent://`` producer.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
from dataclasses import dataclass

from segtxn.aio import callbacks_context
from segtxn.client.closables import Closable
from segtxn.client.connection import Connector
from segtxn.client.errors import ClientClosed, Timeout
from segtxn.client.layout import TopicLayout
from segtxn.client.messages import MessageId, check_outgoing
from segtxn.client.poisoning import poisons
from segtxn.client.producer import Producer
from segtxn.client.producer_options import ProducerOptions, new_name
from segtxn.client.timeouts import Deadline, Expiries
from segtxn.client.transaction import Transaction
from segtxn.protocol.errors import ErrorCategory, TopicTerminatedError
from segtxn.protocol.names import TopicName

__all__ = ["ScalableProducer"]

REROUTE_WAIT_S = 30.0
"""How long a refused send waits for a layout with an open segment for its key."""


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
    deadline: Deadline
    """When the application's send times out (re-sends included)."""
    via: Producer | None = None
    """The segment producer it was last handed to (its trouble explains a timeout)."""


class ScalableProducer(Closable):
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
        self._topic = str(topic)  # registered with every transactional send
        self.name = name or new_name(self)
        self.options = options or ProducerOptions()
        self._connector = connector
        self.layout = TopicLayout(connector, topic)
        self._producers: dict[int, Producer] = {}
        self._round_robin = itertools.count()
        self._numbers = itertools.count()
        self._lock = asyncio.Lock()
        self._start_trouble: str | None = None
        """Why the last segment producer that could not start failed (None once one
        started): a send that gives up waiting for its segment's producer names it."""
        self._order = asyncio.Lock()  # FIFO: one sender at a time while in transition
        self._refused: list[_Outgoing] = []
        self._unsettled: dict[int, set[asyncio.Future[MessageId]]] = {}
        """Segment id -> sends routed there whose outcome :meth:`_settled` has not taken in
        (a segment producer forgets a send a moment before that: no gap in between)."""
        self._outstanding: set[asyncio.Future[MessageId]] = set()
        """The application's sends not yet done (what ``flush`` waits for)."""
        self._callbacks = callbacks_context()
        self._drainer: asyncio.Task[None] | None = None
        self._retirer: asyncio.Task[None] | None = None
        self._expiries: Expiries[_Outgoing] = Expiries(
            self._expire, lambda message: not message.result.done()
        )
        self.reroutes = 0
        self._closed = False

    async def start(self, deadline: Deadline) -> None:
        """Read the segment DAG (retrying until ``deadline``: Timeout after it)."""
        await self.layout.start(deadline)
        self._retirer = asyncio.create_task(self._retire(), name=f"producer-retire-{self.name}")

    async def _retire(self) -> None:
        """Close the producer of each segment the layout shows sealed once nothing sent
        through it is unsettled: a sealed segment takes no more sends, and an open producer
        would keep it loaded on its broker (with a connection) for good."""
        while True:
            await self.layout.changed.wait()
            async with self._order:  # no send is being routed or sent again meanwhile
                if not self._in_transition():  # else the send that meets it closes them
                    await self._close_sealed()

    async def _close_sealed(self) -> None:
        """(Holding ``_order``, nothing in transition.) See :meth:`_retire`."""
        for segment in self._retired():
            if (s := self.layout.segments.get(segment)) and s.active:
                continue  # refused a send, but the layout does not show it sealed yet
            if not self._unsettled.get(segment):
                self._unsettled.pop(segment, None)
                await self._producers.pop(segment).close(timeout_s=0)

    async def refresh(self) -> None:
        """Re-read the topic's segments now."""
        await self.layout.refresh()

    def route(self, key: str | None) -> int:
        """The id of the active segment for ``key`` (round-robin when there is none)."""
        return self.layout.route(key, next(self._round_robin))

    async def _producer(self, segment_id: int, deadline: Deadline) -> Producer:
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
                    try:
                        await producer.start(deadline)
                    except BaseException:  # (a cancel too: the send's own limit)
                        self._start_trouble = producer.trouble
                        raise
                    self._start_trouble = None
                    if self._closed:  # closed while it connected: close() has not seen it
                        await producer.close(timeout_s=0)
                        raise ClientClosed(f"producer {self.name} is closed")
                    self._producers[segment_id] = producer
        return producer

    def _is_retired(self, segment: int, producer: Producer) -> bool:
        """No longer active, or it refused a send (sealed: its sends may be refused)."""
        return producer.refused or not (s := self.layout.segments.get(segment)) or not s.active

    def _retired(self) -> list[int]:
        return [
            segment
            for segment, producer in self._producers.items()
            if self._is_retired(segment, producer)
        ]

    def _unsettled_on_retired(self) -> list[asyncio.Future[MessageId]]:
        return [f for segment in self._retired() for f in self._unsettled.get(segment, ())]

    def _in_transition(self) -> bool:
        """Refused sends wait to go again, or a send to a segment no longer active is
        unsettled. (Asked on every send: it builds no list and stops at the first.)"""
        return bool(self._refused) or any(
            self._unsettled.get(segment) and self._is_retired(segment, producer)
            for segment, producer in self._producers.items()
        )

    async def send_async(
        self,
        value: bytes,
        *,
        key: str | None = None,
        properties: dict[str, str] | None = None,
        event_time_ms: int | None = None,
        txn: Transaction | None = None,
    ) -> asyncio.Future[MessageId]:
        """Queue one message; the future resolves to its id once stored. See
        :meth:`send` for the errors (raised here when the message never left)."""
        deadline = Deadline(self.options.send_limit_s)
        with poisons(txn):  # refused before it is tracked: it must not commit without it
            self._check_open()
            check_outgoing(value, key, properties, event_time_ms)  # before its key is hashed
            if txn is not None and not txn.joined(self._topic):
                await txn.add_partition(self._topic, deadline)
        result: asyncio.Future[MessageId] = asyncio.get_running_loop().create_future()
        message = _Outgoing(
            next(self._numbers), value, key, properties, event_time_ms, txn, result, deadline
        )
        if deadline.at is not None:
            self._expiries.add(deadline.at, message)
        self._outstanding.add(result)
        result.add_done_callback(self._outstanding.discard, context=self._callbacks)
        if txn is not None:
            txn.operations.track(result)
        try:
            if not (self._in_transition() or self._order.locked()):
                segment = self.route(message.key)
                producer = self._producers.get(segment)
                if producer is not None:  # the common case: its send_async keeps the limit
                    await self._send_via(message, segment, producer)
                    return result
                async with deadline.timeout():
                    await self._send_via(
                        message, segment, await self._producer(segment, message.deadline)
                    )
            else:
                async with deadline.timeout(), self._order:  # behind everything sent before
                    await self._settle_transition()
                    await self._dispatch(message)
        except Timeout as e:  # from below (a segment's producer could not be created)
            self._fail(result, e)
            raise
        except TimeoutError as e:  # this send's own limit
            trouble = self._start_trouble
            failure = Timeout(
                f"{self.name}: could not send within {deadline} (waiting for re-sends "
                "before it, or for its segment's producer"
                + (f": last trouble: {trouble}" if trouble else "")
                + "); nothing was sent",
                category=ErrorCategory.RETRIABLE,
            )
            self._fail(result, failure)
            raise failure from e
        except BaseException as e:
            self._fail(result, e)
            raise
        return result

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed(f"producer {self.name} is closed")

    def _fail(self, result: asyncio.Future[MessageId], error: BaseException) -> None:
        """The send failed before it was queued: its future says so, and refused sends it
        was sending again go on in the background."""
        if not result.done():
            if isinstance(error, asyncio.CancelledError):
                result.cancel()
            else:
                result.set_exception(error)
        if not result.cancelled():
            result.exception()  # retrieved: the caller gets ``error`` raised instead
        self._kick()

    def _expire(self, message: _Outgoing) -> None:
        if not message.result.done():
            trouble = None if message.via is None else message.via.trouble
            message.result.set_exception(
                Timeout(
                    f"{self.name}: message {message.number} was not stored within "
                    f"{message.deadline} of its send; it may or may not have been stored"
                    + (f" (last trouble: {trouble})" if trouble else "")
                )
            )

    async def _dispatch(self, message: _Outgoing) -> None:
        segment = self.route(message.key)
        await self._send_via(message, segment, await self._producer(segment, message.deadline))

    async def _send_via(self, message: _Outgoing, segment: int, producer: Producer) -> None:
        message.via = producer
        inner = await producer.send_async(
            message.value,
            key=message.key,
            properties=message.properties,
            event_time_ms=message.event_time_ms,
            txn=message.txn,
            registered=True,
            track=False,
            deadline=message.deadline,
            tracked=message.result,
        )
        unsettled = self._unsettled.get(segment)
        if unsettled is None:
            unsettled = self._unsettled[segment] = set()
        unsettled.add(inner)
        inner.add_done_callback(
            functools.partial(self._settled, message, segment), context=self._callbacks
        )

    def _settled(self, message: _Outgoing, segment: int, inner: asyncio.Future[MessageId]) -> None:
        self._unsettled[segment].discard(inner)
        if inner.cancelled():
            if not message.result.done():
                message.result.cancel()
            return
        # Taken in first, whatever happened to the application's future: the segment's
        # future is this producer's own, and one whose error nobody retrieves is logged with
        # a traceback when freed (one per send in flight when a broker stays down past the
        # send timeout: both futures fail then, the application's first).
        error = inner.exception()
        if message.result.done():
            return
        if isinstance(error, TopicTerminatedError):
            self._refused.append(message)
            self._kick()
        elif error is not None:
            message.result.set_exception(error)
        else:
            message.result.set_result(inner.result())

    def _kick(self) -> None:
        """Make sure refused sends are being sent again."""
        if self._in_transition() and (self._drainer is None or self._drainer.done()):
            self._drainer = asyncio.create_task(self._drain(), name=f"reroute-{self.name}")

    async def _drain(self) -> None:
        async with self._order:
            await self._settle_transition()

    async def _settle_transition(self) -> None:
        """(Holding ``_order``.) Wait for sends to retired segments to settle, and send the
        refused ones again, oldest first, until nothing is in transition. Cancelled half-way
        (a send's timeout), what is not yet sent again stays refused for the next one."""
        while self._in_transition():
            unsettled = self._unsettled_on_retired()
            if unsettled:  # their _settled callbacks run before this wakes up
                await asyncio.wait(unsettled)
            while self._refused:
                message = min(self._refused, key=lambda m: m.number)
                if not message.result.done():  # else it timed out: not sent again
                    self.reroutes += 1
                    try:
                        await self._wait_rerouted(message)
                        await self._dispatch(message)
                    except Exception as e:  # the caller learns of it through its future
                        if not message.result.done():
                            message.result.set_exception(e)
                self._refused.remove(message)
        await self._close_sealed()

    async def _wait_rerouted(self, message: _Outgoing) -> None:
        """Wait until the message's key routes to an active segment the layout knows as
        active (the push of the new DAG may come after the refusal)."""
        limit = message.deadline.cap(REROUTE_WAIT_S)
        deadline = Deadline(limit)
        while True:
            segment = self.layout.segments.get(self.route(message.key))
            if segment is not None and segment.active and segment.id not in self._sealed_seen():
                return
            if deadline.expired():
                raise TopicTerminatedError(f"{self.topic}: no layout with an open segment came")
            if self.layout.failed is not None:  # no newer layout will come
                raise self.layout.failed
            try:
                async with asyncio.timeout(deadline.cap(0.5)):
                    await self.layout.changed.wait()
            except TimeoutError:
                await self.layout.refresh(deadline.cap(None))  # the push may be late: ask

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
        """Send one message to the segment covering ``key``; returns its id once stored.

        Raises:
            ServerError: the broker refused it (re-sends after a seal included).
            CertificateError: its segment was sealed, and the broker of the topic's lookup
                session (which tells the segments that replace it) has a TLS certificate
                the client does not trust: no layout to send it on again will come.
            Timeout: not done within ``send_timeout_s`` of the call (RETRIABLE if it never
                left, else OUTCOME_UNKNOWN).
            ClientClosed: the producer was closed (or is closing) before the call: nothing
                was sent; or it closed before the message was stored (it may have been).
            TransactionEnded: ``txn`` has ended (committed, or aborted, perhaps by an
                ``abort()`` that stopped waiting while this send waited): nothing was sent.
            TypeError / ValueError: the message is not one the broker could read (a value
                not bytes, a property not str, ...: :func:`~segtxn.client.messages.check_outgoing`);
                nothing was sent.
        """
        future = await self.send_async(
            value, key=key, properties=properties, event_time_ms=event_time_ms, txn=txn
        )
        return await future

    async def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every message sent so far is stored or failed, re-sends included;
        without ``timeout_s`` bounded by the sends' own ``send_timeout_s``.

        Raises:
            Timeout: messages still in flight after ``timeout_s``.
        """
        deadline = Deadline(timeout_s)
        waiting = list(self._outstanding)
        if not waiting:
            return
        _, late = await asyncio.wait(waiting, timeout=deadline.remaining())
        if late:
            raise Timeout(f"{self.name}: {len(late)} messages still in flight after {deadline}")

    async def close(self, timeout_s: float | None = None) -> None:
        """Refuse new sends (ClientClosed), flush what was sent (re-sends included) for at
        most ``timeout_s`` (default: the operation timeout), fail what is left with
        ClientClosed, then disconnect every segment's producer (at most 1 s more).
        Idempotent."""
        limit = self._connector.timeouts.limit(timeout_s)
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Timeout):  # what is left fails with ClientClosed below
            await self.flush(limit)
        for task in (self._drainer, self._retirer):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        for message in self._refused:
            if not message.result.done():
                message.result.set_exception(ClientClosed(f"producer {self.name} is closed"))
        self._refused = []
        await asyncio.gather(*(p.close(timeout_s=0) for p in self._producers.values()))
        self._expiries.clear()
        await self.layout.close()
        self._close_done()
