"""A producer's connection to its broker, kept up: the half of a
:class:`~segtxn.client.producer.Producer` that connects, reconnects and moves frames.

:class:`ProducerConnection` owns the producer's WebSocket and the one task that runs it:
connecting (and learning where the sequence ids continue), writing what the sends queued in
:class:`~segtxn.client.inflight.InFlight` (batched), reading the broker's receipts and
errors into it, and reconnecting with back-off when the connection is lost, every
unacknowledged message then written again (the broker de-duplicates them). While no broker
can be reached, an :class:`~segtxn.client.outage.Outage` fails the sends in flight with
ConnectionLost once the client's ``request_timeout_s`` has passed; a refusal that will not
pass (``FATAL``) or a broker certificate the client does not trust ends the connection for
good, failing every send in flight and (``_failure``) each one made later.

It never takes a message from an application: the send API (``send``, ``send_async``,
``flush``, ``close``) is :class:`~segtxn.client.producer.Producer`, which queues messages
into ``_in_flight`` and sets ``_wake``; this half writes them. Apart because the two change
for different reasons (the wire and its failures; what a send promises its caller).
"""

from __future__ import annotations

import asyncio
import logging
import secrets

import aiohttp
import msgspec

from segtxn.aio import first_completed
from segtxn.client.commitchannel import CommitChannel
from segtxn.client.connection import Connector, server_frames
from segtxn.client.errors import CertificateError, ClientClosed, Timeout
from segtxn.client.inflight import InFlight
from segtxn.client.messages import MessageId
from segtxn.client.outage import Outage
from segtxn.client.producer_options import ProducerOptions, new_name
from segtxn.client.timeouts import Deadline, close_quietly, retrying
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
from segtxn.protocol.frames import CommitAnswer, Error, ProducerReady, Receipt, SendBatch
from segtxn.protocol.names import TopicName
from segtxn.protocol.txnops import send_op

__all__ = ["FATAL", "ProducerConnection"]

log = logging.getLogger("segtxn.client.producer")
"""The producer's logger (its records kept their name when this half moved out)."""


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


class ProducerConnection:
    """One producer's connection to the broker of its topic: :meth:`start` connects (until
    a deadline), and its task then writes queued sends and commits, reads receipts, and
    reconnects until :meth:`_disconnect` (or a refusal for good) ends it.

    State shared with the send API: ``_in_flight`` (the messages not yet answered),
    ``_wake`` (set when there is something to write), ``_next_seq`` (known once connected),
    ``_max_bytes`` (the broker's message size limit), ``_failure`` (what ended the
    connection for good: a send made later raises it) and ``_closed``."""

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

    def _timed_out(self, seq: int) -> Timeout:
        """What a send gets at its timeout."""
        return Timeout(
            f"{self.name}: message {seq} was not acknowledged within "
            f"{self.options.send_timeout_s:g} s of its send; it may or may not have "
            "been stored" + (f" (last trouble: {self._trouble})" if self._trouble else "")
        )

    @property
    def trouble(self) -> str | None:
        """The last reason its connection was lost or refused (None since it connected):
        what a send's :class:`Timeout` names as its last trouble."""
        return self._trouble

    async def _disconnect(self) -> None:
        """End the connection for good: stop its task, close its socket, and fail every
        commit and send still in flight with ClientClosed (``_closed`` is set first, so
        that nothing reconnects meanwhile)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._ws is not None:  # a task cancelled before it ran never closed its socket
            await close_quietly(self._ws.close())
        self.commits.lost(f"producer {self.name} is closed")
        self._fail_all(ClientClosed(f"producer {self.name} is closed"))
