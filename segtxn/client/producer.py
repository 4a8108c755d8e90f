"""Producers: send messages, survive reconnects without duplicates.

A :class:`Producer` writes to one ``persistent://`` topic or one segment over one WebSocket.
Every message gets the next sequence id of the producer's *name*; the broker stores a
(name, sequence id) once, so after a reconnect every unacknowledged message is simply sent
again. The first sequence id continues from what the broker last stored for the name, so a
restarted application that reuses its producer name is de-duplicated too.

At most ``max_pending`` messages are in flight: ``send`` waits for room (backpressure;
:mod:`segtxn.client.inflight`).
With batching, messages queued while a frame is being written travel together in one
``SendBatch`` frame (``batch_delay_s`` may hold a batch open a little longer).

Time limits: a send ends within ``send_timeout_s`` of the call, room in the window and
(in a transaction) its registration with the coordinator included, and sooner when its
connection is lost and no broker can be reached for the client's ``request_timeout_s``
(``ConnectionLost``: a broker restarting within it loses nothing); creating a producer
retries a broker that is down or restarting until the client's operation timeout;
``flush`` and ``close`` take a ``timeout_s`` (docs/protocol.md, "Client time limits").
Scalable topics: :mod:`segtxn.client.scalable`. The settings:
:mod:`segtxn.client.producer_options`; a send's span (tracing on): :mod:`segtxn.client.spans`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
from typing import Any

import aiohttp
import msgspec

from segtxn import tracing
from segtxn.aio import first_completed
from segtxn.client.closables import Closable
from segtxn.client.commitchannel import CommitChannel
from segtxn.client.connection import Connector, server_frames
from segtxn.client.errors import (
    CertificateError,
    ClientClosed,
    ClientError,
    MessageTooLarge,
    Timeout,
)
from segtxn.client.inflight import InFlight, Pending
from segtxn.client.messages import MessageId, check_outgoing
from segtxn.client.outage import Outage
from segtxn.client.poisoning import poisons
from segtxn.client.producer_options import ProducerOptions, new_name
from segtxn.client.spans import send_span, send_span_ends
from segtxn.client.timeouts import Deadline, close_quietly, retrying
from segtxn.client.transaction import Transaction
from segtxn.protocol import frames
from segtxn.protocol.errors import (
    ErrorName,
    InvalidArgument,
    InvalidTopicName,
    NotAllowed,
    NotAuthorized,
    ProducerBusy,
    ServerError,
    ServiceNotReady,
    TopicNotFound,
    TopicTerminatedError,
    Unauthenticated,
    UnknownError,
    server_error,
)
from segtxn.protocol.frames import CommitAnswer, Error, ProducerReady, Receipt, Send, SendBatch
from segtxn.protocol.names import TopicName
from segtxn.protocol.txnops import send_op

__all__ = ["Producer"]

log = logging.getLogger(__name__)


FATAL = (
    TopicNotFound,
    InvalidTopicName,
    NotAllowed,
    ProducerBusy,
    InvalidArgument,
    Unauthenticated,  # the token expired, or the key changed: it will not pass
    NotAuthorized,
)
"""Refusals that end a producer's connection for good: reconnecting would meet them again."""


class Producer(Closable):
    """Messages to one ``persistent://`` topic or one ``segment://`` (a scalable topic's
    producer, :class:`~segtxn.client.scalable.ScalableProducer`, holds one per segment).
    Get it from ``client.create_producer()``.

    Each message is stored once, in the order sent, across reconnects (the broker
    de-duplicates by producer name and sequence id); at most ``max_pending`` are in flight
    and a send waits for room. ``send`` returns once the message is stored; ``send_async``
    queues it and returns a future, which a transaction's commit waits for."""

    def __init__(
        self,
        connector: Connector,
        topic: TopicName,
        name: str | None = None,
        options: ProducerOptions | None = None,
    ) -> None:
        self.topic = topic
        self._topic = str(topic)  # in every receipt's message id
        self.name = name or new_name(self)
        self._instance = secrets.token_hex(8)  # only it takes its name over from an old link
        self.options = options or ProducerOptions()
        self._connector = connector
        self._in_flight = InFlight(self.options.max_pending, self._timed_out)
        self._ready = asyncio.Event()
        self._wake = asyncio.Event()
        self._next_seq = 0
        self._max_bytes = 0
        self._failure: BaseException | None = None
        self._closed = False
        self._connected = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        """The connection of the moment (closed by close() too: a task cancelled before it
        ran never closes it)."""
        self._broker = ""
        """The URL of the broker the connection of the moment is to."""
        self.reconnects = 0
        self._trouble: str | None = None
        """The last reason a connection was lost or refused (a timeout names it)."""
        self.refused = False
        """The broker refused a send because the topic is terminated (a sealed segment)."""
        self.commits = CommitChannel(self._wake.set)
        """One-step commits asked on its connection (:mod:`segtxn.client.commitchannel`)."""

    # ------------------------------------------------------------------ lifecycle

    async def start(self, deadline: Deadline) -> None:
        """Connect, retrying while the topic's broker (or the store behind it) is down or
        restarting, until ``deadline``.

        Raises:
            ServerError: the broker refused the producer (TopicNotFound, ProducerBusy, ...).
            Timeout: not connected by ``deadline`` (it names the last failure).
        """
        ws = await retrying(
            f"create producer {self.name} on {self.topic}",
            self._connect_first,
            deadline,
            request_timeout_s=self._connector.timeouts.request_timeout_s,
            busy=(ProducerBusy,),
        )
        self._ws = ws
        self._task = asyncio.create_task(self._run(ws), name=f"producer-{self.name}")

    async def _connect_first(self) -> aiohttp.ClientWebSocketResponse:
        """:meth:`_connect`, remembering why an attempt failed: a caller that gives up
        waiting for this producer (a scalable producer's send) names it (:attr:`trouble`)."""
        try:
            return await self._connect()
        except ServerError as e:
            self._trouble = f"connecting: {e.name}: {e.message}"
            raise
        except (aiohttp.ClientError, ConnectionError) as e:
            self._trouble = f"connecting: {e!r}"
            raise

    async def _connect(self) -> aiohttp.ClientWebSocketResponse:
        broker = await self._connector.broker_for(self.topic)
        ws, broker = await self._connector.websocket_at(
            broker, "producer", self.topic, "", {"name": self.name, "instance": self._instance}
        )
        try:
            message = await ws.receive()
            if message.type is not aiohttp.WSMsgType.BINARY:
                raise ServiceNotReady("the broker closed the producer")
            try:
                ready = frames.server_frame.decode(message.data)
            except msgspec.DecodeError as e:  # a broker's fault: tried again, as a refusal is
                raise ServiceNotReady(f"undecodable producer_ready from the broker ({e})") from e
            if not isinstance(ready, ProducerReady):
                raise UnknownError(f"expected producer_ready, got {ready!r}")
        except BaseException:  # refused, or given up on (cancelled): do not leak the socket
            await close_quietly(ws.close())
            raise
        self._max_bytes = ready.max_message_bytes
        self._broker = self.commits.broker_url = broker
        if not self._ready.is_set():
            self._next_seq = ready.last_sequence_id + 1
            self._ready.set()
        self._in_flight.send_all_again()
        self._wake.set()
        self._connected.set()
        self._trouble = None
        return ws

    async def _run(self, ws: aiohttp.ClientWebSocketResponse | None) -> None:
        while ws is not None:
            try:
                await first_completed(self._write(ws), self._read(ws), name=f"producer-{self.name}")
            except FATAL as e:
                self._fail_all(e)
                return
            except ServerError as e:
                self._trouble = f"{e.name}: {e.message}"
            except (aiohttp.ClientError, ConnectionError) as e:
                log.info("producer %s lost its connection: %s", self.name, e)
                self._trouble = f"the connection was lost ({e})"
            finally:
                self._connected.clear()
                self.commits.lost(f"producer {self.name} lost its connection to {self._broker}")
                await close_quietly(ws.close())
            if self._closed:
                return
            ws = await self._reconnect()

    async def _reconnect(self) -> aiohttp.ClientWebSocketResponse | None:
        """Connect again, backing off, until it succeeds (the new connection) or it is
        refused for good (None: every send in flight, and each one made later, fails).
        While no broker can be reached, :class:`~segtxn.client.outage.Outage` says when
        the sends in flight stop waiting for one."""
        loop = asyncio.get_running_loop()
        outage = Outage(
            self._connector.timeouts.request_timeout_s,
            lambda why, e: self._in_flight.lost(self.name, self._lost(why), e),
        )
        delay = 0.05
        while True:
            await asyncio.sleep(delay)
            attempt = loop.time()
            try:
                async with asyncio.timeout(self._connector.timeouts.request_timeout_s):
                    ws = self._ws = await self._connect()
                self.reconnects += 1
                return ws
            except ProducerBusy as e:  # the broker has not seen our old connection go:
                self._trouble = f"reconnecting: {e.name}: {e.message}"  # it will, in time
                outage.answered()
            except FATAL as e:
                self._fail_all(e)
                return None
            except CertificateError as e:  # retrying cannot help: say so, not time out
                log.warning("producer %s: reconnecting failed for good: %s", self.name, e)
                self._trouble = f"reconnecting: {e}"
                self._in_flight.lost(self.name, self._lost(f"TLS failed ({e})"), e)
                self._failure = e  # a send made later raises it
                return None
            except ServerError as e:
                self._trouble = f"reconnecting: {e.name}: {e.message}"
                outage.failed(e, attempt)
            except (TimeoutError, aiohttp.ClientError, ConnectionError) as e:
                log.info("producer %s: reconnecting failed: %r", self.name, e)
                self._trouble = f"reconnecting: {e!r}"
                outage.failed(e, attempt)
            delay = min(delay * 2, self.options.reconnect_max_s)

    def _lost(self, why: str) -> str:
        return f"the connection to {self._broker} was lost and {why}"

    async def _write(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        options = self.options
        while True:
            await self._wake.wait()
            self._wake.clear()
            if options.batch_delay_s and 0 < self._in_flight.unsent < options.batch_max_messages:
                await asyncio.sleep(options.batch_delay_s)  # let the batch fill a little
            most = options.batch_max_messages if options.batching else 1
            while batch := self._in_flight.next_batch(most, options.batch_max_bytes):
                for pending in batch:
                    placements = None if pending.txn is None else pending.txn.placements
                    if placements is not None and pending.tracked is not None:
                        name = send_op(self._topic, self.name, pending.send.seq)
                        placements.placed(pending.tracked, self._broker, name, self.commits)
                sends = [pending.send for pending in batch]
                frame: frames.Frame = sends[0] if len(sends) == 1 else SendBatch(sends=sends)
                await ws.send_bytes(frames.encode(frame))
            for commit in self.commits.take():  # after the sends it names
                await ws.send_bytes(frames.encode(commit))

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for frame in server_frames(ws, f"producer {self.name}"):
            if isinstance(frame, Receipt):
                self._settle(frame.seq, result=MessageId(self._topic, *frame.message_id))
            elif isinstance(frame, CommitAnswer | Error) and frame.request_id is not None:
                self.commits.answered(frame)  # (a send's error names its seq instead)
            elif isinstance(frame, Error):
                error = server_error(ErrorName.parse(frame.error), frame.message)
                if frame.seq is not None:
                    self._settle(frame.seq, error=error)
                elif not self.commits.unreadable(error):
                    log.warning("producer %s: %s", self.name, error)
        raise ConnectionError("the broker closed the connection")

    def _settle(
        self, seq: int, *, result: MessageId | None = None, error: BaseException | None = None
    ) -> None:
        if self._in_flight.settle(seq, result=result, error=error) and isinstance(
            error, TopicTerminatedError
        ):
            self.refused = True

    def _fail_all(self, error: BaseException) -> None:
        self._failure = error
        self._in_flight.fail_all(error)

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

        Cancelling it does not take the message back once queued: it goes on (it may be
        stored) and holds its place among the ``max_pending`` until the broker answers or
        its ``send_timeout_s`` ends.

        Raises:
            MessageTooLarge: the broker refused the payload as larger than it accepts.
            ServerError: the broker refused this message (e.g. TopicTerminatedError).
            Timeout: not done within ``send_timeout_s`` of the call (OUTCOME_UNKNOWN once
                it was queued: it may have been stored).
            ConnectionLost: the connection was lost, and no broker could be reached for
                the client's ``request_timeout_s``, or reconnecting met a broker
                certificate the client does not trust (OUTCOME_UNKNOWN if it was written:
                it may have been stored, and sending it again may store it twice; else
                RETRIABLE: it was not). After a CertificateError, later sends raise it.
            ClientClosed: the producer was closed.
            TransactionEnded: ``txn`` has ended (committed, or aborted, perhaps by an
                ``abort()`` that stopped waiting while this send waited for room): nothing
                was sent.
            TypeError / ValueError: the message is not one the broker could read (a value
                not bytes, a property not str, ...: :func:`~segtxn.client.messages.check_outgoing`);
                nothing was sent.
        """
        future = await self.send_async(
            value, key=key, properties=properties, event_time_ms=event_time_ms, txn=txn
        )
        return await future

    def _timed_out(self, seq: int) -> Timeout:
        """What a send gets at its timeout."""
        return Timeout(
            f"{self.name}: message {seq} was not acknowledged within "
            f"{self.options.send_timeout_s:g} s of its send; it may or may not have "
            "been stored" + (f" (last trouble: {self._trouble})" if self._trouble else "")
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
        deadline: Deadline | None = None,
        tracked: asyncio.Future[Any] | None = None,
    ) -> asyncio.Future[MessageId]:
        """Queue one message (waiting for room in the window); the future resolves to its
        id once stored. Messages queued by one task are stored in the order queued.

        The whole send — registering with ``txn``, waiting for room, the broker's receipt —
        ends within ``send_timeout_s`` of this call (or ``deadline``): then the future
        fails with :class:`Timeout` (or this raises it, when the message never left).

        In ``txn``, the send is counted by the transaction from this call on (its commit
        waits for it, while it registers its topic and waits for room in the window too),
        and anything this raises poisons the transaction (with ``track``; without it, the
        caller counts and tracks the send, and poisons it).

        ``registered``, ``track``, ``deadline`` and ``tracked`` (the future ``txn`` tracks
        for this send, when not this one's) are for a ScalableProducer sending through this
        one: applications leave them at their defaults."""
        in_txn = txn if track else None
        with poisons(in_txn), _counted(in_txn):
            return await self._queue(
                value,
                key=key,
                properties=properties,
                event_time_ms=event_time_ms,
                txn=txn,
                registered=registered,
                track=track,
                deadline=deadline,
                tracked=tracked,
            )

    async def _queue(
        self,
        value: bytes,
        *,
        key: str | None,
        properties: dict[str, str] | None,
        event_time_ms: int | None,
        txn: Transaction | None,
        registered: bool,
        track: bool,
        deadline: Deadline | None,
        tracked: asyncio.Future[Any] | None,
    ) -> asyncio.Future[MessageId]:
        deadline = deadline or Deadline(self.options.send_limit_s)
        self._check_usable()  # refused here, before it starts or joins a transaction
        check_outgoing(value, key, properties, event_time_ms)
        if self._max_bytes and len(value) > self._max_bytes:
            raise MessageTooLarge(f"{len(value)} bytes exceeds the broker's {self._max_bytes}")
        if txn is not None and not registered:
            await txn.add_partition(self._topic, deadline)
            self._check_usable()  # closed while it registered
        await self._in_flight.room(deadline, self.name)
        try:  # the room may be what closing it, or its failure, freed; an abort() that
            self._check_usable()  # stopped waiting for this send may have ended ``txn``
            if txn is not None:
                txn.check_not_ended()
        except (ClientError, ServerError):
            self._in_flight.give_back()  # nothing was queued
            raise
        seq = self._next_seq
        self._next_seq += 1
        future: asyncio.Future[MessageId] = asyncio.get_running_loop().create_future()
        span = send_span(str(self.topic), seq, txn)
        send = Send(
            seq=seq,
            payload=value,
            key=key,
            properties=dict(properties or {}),
            event_time_ms=event_time_ms,
            txn=None if txn is None else txn.wire_id,
            traceparent=tracing.traceparent(span),
        )
        if span is not None:
            future.add_done_callback(functools.partial(send_span_ends, span))
        if txn is not None and track:
            tracked = future
        self._in_flight.add(Pending(send, future, txn, tracked), deadline)
        self._wake.set()
        if txn is not None and track:
            txn.operations.track(future)
        return future

    def _check_usable(self) -> None:
        """Raises ClientClosed once it is closed, or the refusal that ended its connection
        for good (``FATAL``): nothing sends a message queued after either."""
        if self._closed:
            raise ClientClosed(f"producer {self.name} is closed")
        if self._failure is not None:
            raise self._failure

    async def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every message sent so far is stored (or failed). Without
        ``timeout_s`` this is bounded by the sends' own ``send_timeout_s``.

        Raises:
            Timeout: messages were still in flight after ``timeout_s`` (OUTCOME_UNKNOWN:
                they go on, each within its own send timeout).
        """
        await self._in_flight.flush(Deadline(timeout_s), self.name)

    @property
    def pending(self) -> int:
        return len(self._in_flight)

    @property
    def trouble(self) -> str | None:
        """The last reason its connection was lost or refused (None since it connected):
        what a send's :class:`Timeout` names as its last trouble."""
        return self._trouble

    async def close(self, timeout_s: float | None = None) -> None:
        """Flush for at most ``timeout_s`` (default: the operation timeout), fail what is
        still in flight with ClientClosed, then disconnect (waiting at most 1 s for the
        broker). Idempotent."""
        limit = self._connector.timeouts.limit(timeout_s)
        if self._closed:
            return
        if self._failure is None and self._task is not None and not self._task.done():
            try:
                await self.flush(limit)
            except Timeout:
                log.info("producer %s: closing with %d sends in flight", self.name, self.pending)
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._ws is not None:  # a task cancelled before it ran never closed its socket
            await close_quietly(self._ws.close())
        self.commits.lost(f"producer {self.name} is closed")
        self._fail_all(ClientClosed(f"producer {self.name} is closed"))
        self._close_done()


def _counted(txn: Transaction | None) -> contextlib.AbstractContextManager[None]:
    """Count a send in ``txn`` from its call until it is tracked (``operations.joining``):
    the application called ``send`` before ``commit``, so the commit must wait for it,
    while it waits for room in a full window too (it was counted only once it had room,
    and a v4 commit went ahead without it: the send then failed, the transaction ended)."""
    return contextlib.nullcontext() if txn is None else txn.operations.joining()
