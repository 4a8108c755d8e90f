"""One WebSocket of messages from a broker, reconnecting: the part consumers and readers
share.

A consumer's stream keeps the ordering promise of docs/protocol.md ("Ordered redelivery"): it
drops its undelivered messages on a reconnect, on a ``rewind`` frame and when it stops being
the active Failover member (the broker delivers them again, and their permits are granted
again), and while a redelivery it asked for (after a transaction that did not commit, or a
negative ack) is not yet answered it drops the messages that arrive (they were sent before the
rewind). A reader's stream keeps them, and after a reconnect resumes after the last one it
received.

Every outcome of such a request ends the wait for its rewind: the rewind itself; the
broker's refusal (an ``error`` frame naming the request), after which the stream attaches
again, since only a rewind brings back what it dropped and an attachment starts from one; a
lost connection (the same); a write that fails otherwise (a bug: the stream logs it at
WARNING and attaches again too); and a caller that gives up (times out, is cancelled) does
not take the request back: the stream owns it and writes it anyway, and no error of the
stream's own tasks is left for asyncio to report as "never retrieved".

This module is the stream's attaching, reconnecting and reading (and the requests answered by
a rewind); what it writes, and how (its acks gathered into frames, one write lock, the tasks
it owns), is :mod:`segtxn.client.streamwrites`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp
import msgspec

from segtxn.client.acks import request_ids
from segtxn.client.connection import Connector, server_frames
from segtxn.client.errors import CertificateError
from segtxn.client.messages import Message, MessageId
from segtxn.client.outage import Outage
from segtxn.client.streamwrites import StreamWrites
from segtxn.client.timeouts import Deadline, close_quietly, retrying
from segtxn.protocol import frames
from segtxn.protocol.errors import (
    ConsumerBusy,
    ErrorName,
    InvalidArgument,
    InvalidTopicName,
    NotAllowed,
    NotAuthorized,
    PersistenceError,
    ServerError,
    ServiceNotReady,
    SubscriptionNotFound,
    TopicNotFound,
    Unauthenticated,
    server_error,
)
from segtxn.protocol.frames import (
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
from segtxn.protocol.names import TopicName

log = logging.getLogger(__name__)

FATAL = (
    TopicNotFound,
    InvalidTopicName,
    NotAllowed,
    ConsumerBusy,
    InvalidArgument,
    SubscriptionNotFound,
    Unauthenticated,  # the token expired, or the key changed: it will not pass
    NotAuthorized,
)
"""Refusals that end a stream for good: ``receive`` raises them instead of reconnecting."""


class MessageStream(StreamWrites):
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
        subscription: str | None = None,
    ) -> None:
        super().__init__(kind, topic)
        self._subscription = subscription
        self._ordered = ordered
        self._connector = connector
        self._suffix, self._query = suffix, query
        self._size = receiver_queue_size
        self._deliver = deliver
        self._on_end = on_end
        self._granted = 0
        self._awaiting: set[int] = set()
        """Redeliver / Nack requests whose Rewind has not come: messages arriving meanwhile
        were sent before the rewind and are dropped. An id leaves it with its Rewind, its
        Error (then the stream attaches again) or a new attachment; nothing else."""
        self.epoch = 0
        self.active = True
        self.ended = asyncio.Event()
        self.failed: ServerError | CertificateError | None = None
        """What ended this stream for good (:meth:`_end`): it no longer reconnects."""
        self._task: asyncio.Task[None] | None = None
        self.reconnects = 0

    async def start(self, deadline: Deadline) -> None:
        """Attach, retrying while the topic's broker (or the store behind it) is down or
        restarting, until ``deadline``.

        Raises:
            ServerError: the broker refused (TopicNotFound, ConsumerBusy, ...).
            Timeout: not attached by ``deadline`` (it names the last failure).
        """
        ws = await retrying(
            f"attach a {self._kind} to {self.topic}",
            self._connect,
            deadline,
            request_timeout_s=self._connector.timeouts.request_timeout_s,
            busy=(ConsumerBusy,),
        )
        self._task = asyncio.create_task(self._run(ws), name=f"{self._kind}-{self.topic}")

    async def _connect(self) -> aiohttp.ClientWebSocketResponse:
        """Attach (again) and grant permits; acks whose receipts never came are sent again.

        Raises:
            ServerError: what the broker refused with, or ServiceNotReady when the
                connection failed half-way (retriable).
        """
        broker = await self._connector.broker_for(self.topic)
        ws, broker = await self._connector.websocket_at(
            broker, self._kind, self.topic, self._suffix, self._query
        )
        try:
            if self._kind == "consumer":
                message = await ws.receive()
                ready = (
                    frames.server_frame.decode(message.data)
                    if message.type is aiohttp.WSMsgType.BINARY
                    else None
                )
                if not isinstance(ready, ConsumerReady):
                    raise ServiceNotReady("the broker did not accept us")
                self.active = ready.active
                self.epoch = ready.epoch
            # Acks whose receipts never came go first, before anything new and before the
            # permits: the broker takes them in before it delivers again, so what they
            # acknowledge is not delivered again (it was, once its reads were quick).
            async with self._writing:
                for frame in self._acks.unanswered():
                    self._acks.placing(frame, broker)
                    await ws.send_bytes(frames.encode(frame))
                await ws.send_bytes(frames.encode(Flow(permits=self._size)))
                self._ws, self._broker = ws, broker
        except (aiohttp.ClientError, ConnectionError, msgspec.DecodeError) as e:
            await close_quietly(ws.close())
            raise ServiceNotReady(f"{self.topic}: the connection failed ({e!r})") from e
        except BaseException:  # refused, or given up on (cancelled): do not leak the socket
            await close_quietly(ws.close())
            raise
        self._awaiting.clear()  # a new attachment: the broker starts it from a rewind
        self._granted = self._size
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
                await close_quietly(ws.close())
            if self._kind == "consumer":
                dropped = self._drop_queued()
                if dropped:
                    log.info(
                        "%s on %s: %d queued message(s) dropped (reconnecting)",
                        self._kind,
                        self.topic,
                        dropped,
                    )
            told: set[tuple[str, str]] = set()  # refusals of this reconnection so far
            outage = Outage(
                self._connector.timeouts.request_timeout_s,
                lambda why, e: self._acks.lost(self._broker, why, e),
            )
            while True:
                await asyncio.sleep(delay)
                attempt = asyncio.get_running_loop().time()
                try:
                    async with asyncio.timeout(self._connector.timeouts.request_timeout_s):
                        ws = await self._connect()
                    self.reconnects += 1
                    delay = 0.05
                    break
                except FATAL as e:
                    self._end(e, f"the broker refused it ({e.name}: {e.message})")
                    return
                except CertificateError as e:  # retrying cannot help: say so, not hang
                    self._end(e, f"TLS failed ({e})")
                    return
                except ServerError as e:  # not one that ends the stream: back off and retry
                    self._refused(e, told)
                    outage.failed(e, attempt)
                except (TimeoutError, aiohttp.ClientError, ConnectionError) as e:
                    log.info("%s on %s: reconnecting failed: %r", self._kind, self.topic, e)
                    outage.failed(e, attempt)
                delay = min(delay * 2, 2.0)

    def _end(self, error: ServerError | CertificateError, why: str) -> None:
        """Attaching again failed for good with ``error`` (a refusal retrying would meet
        again, or a certificate the client does not trust): ``receive`` raises it, and
        every ack still awaited, or made from now on, fails at once with ConnectionLost
        saying ``why`` (they would otherwise wait out their timeouts on a stream that
        no longer reconnects)."""
        log.warning("%s on %s: attaching again failed for good: %s", self._kind, self.topic, error)
        self.failed = error
        self._acks.end(self._broker, f"attaching again failed for good: {why}", error)
        self._deliver.put_nowait(error)

    def _refused(self, error: ServerError, told: set[tuple[str, str]]) -> None:
        """Log a reconnection's refusal (the broker says to retry: the topic is unloaded,
        the broker fenced, ...) at WARNING the first time it says this, then at DEBUG."""
        said = (error.name, error.message)
        level = logging.DEBUG if said in told else logging.WARNING
        told.add(said)
        log.log(level, "%s on %s: reconnecting refused: %s", self._kind, self.topic, error)

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
        async for frame in server_frames(ws, str(self.topic)):
            if isinstance(frame, MessageFrame):
                if self._awaiting:  # sent before the rewind we asked for: it comes again
                    log.debug(
                        "%s on %s: %s dropped, awaiting %s",
                        self._kind,
                        self.topic,
                        frame.message_id,
                        self._awaiting,
                    )
                    await self.taken()
                    continue
                self._deliver.put_nowait(to_message(self.topic, frame, self._subscription))
                if self._kind == "reader":  # after a reconnect, go on after this one
                    ledger, entry = frame.message_id
                    self._query["start"] = f"{ledger}:{entry + 1}"
            elif isinstance(frame, AckReceipt):
                self._acks.answered(frame.request_id, None)
            elif isinstance(frame, Error):
                error = server_error(ErrorName.parse(frame.error), frame.message)
                if frame.request_id in self._awaiting:
                    # no rewind will answer it, and only a rewind brings back what was
                    # dropped for it: attach again (an attachment starts from one)
                    self._awaiting.discard(frame.request_id)
                    log.warning(
                        "%s on %s: redelivery request %d refused (%s); attaching again",
                        self._kind,
                        self.topic,
                        frame.request_id,
                        error,
                    )
                    raise ConnectionError(f"redelivery request {frame.request_id} refused")
                if frame.request_id:
                    self._acks.answered(frame.request_id, error)
                else:
                    log.warning("%s on %s: %s", self._kind, self.topic, error)
                    if isinstance(error, PersistenceError) and not self._deliver.full():
                        # delivery stopped (damaged data): receive() raises it, naming the
                        # file, instead of waiting in silence (sent again on each flow)
                        self._deliver.put_nowait(error)
            elif isinstance(frame, ActiveChange):
                self.active = frame.active
                if not frame.active:
                    # the broker gives what we had not acked to the new active member: the
                    # ones still queued here must not reach the application too
                    await self._drop_and_regrant("no longer the active consumer")
            elif isinstance(frame, Rewind):
                self.epoch = frame.epoch
                self._awaiting.discard(frame.request_id)
                await self._drop_and_regrant(
                    f"rewind to epoch {frame.epoch}"
                    + (f", answering request {frame.request_id}" if frame.request_id else "")
                )
            elif isinstance(frame, EndOfTopic):
                self.ended.set()
                if self._on_end is not None:
                    self._on_end()
        raise ConnectionError("the broker closed the connection")

    async def _drop_and_regrant(self, why: str) -> int:
        """Drop the queued messages (they come again); their permits were spent on the
        link, so grant them again. Returns how many were dropped."""
        dropped = self._drop_queued()
        if dropped:
            log.info(
                "%s on %s: %d queued message(s) dropped (%s)", self._kind, self.topic, dropped, why
            )
            await self._send(Flow(permits=dropped))
        return dropped

    async def redeliver(self, txn: tuple[int, int] | None = None) -> None:
        """Ask for every unacknowledged message again, once ``txn`` (if given) has let go
        of its acks (after it did not commit); until the broker's Rewind answers, nothing
        more of this stream reaches the application."""
        await self._ask_again(Redeliver(request_id=next(request_ids), txn=txn))

    async def _ask_again(self, frame: Redeliver | Nack) -> None:
        """Send a request answered by a Rewind. From now until the answer, arriving
        messages are dropped; the request is written by a task of the stream, so a caller
        that gives up (cancelled, timed out) leaves it on its way, not lost with the
        messages already dropped for it."""
        if self._ws is None:
            return  # reconnecting: the new attachment starts from a rewind anyway
        self._awaiting.add(frame.request_id)
        task = self._own(self._request(frame), f"{self._kind}-request-{self.topic}")
        await asyncio.shield(task)

    async def _request(self, frame: Redeliver | Nack) -> None:
        """Write a redelivery request. Never raises but a cancellation (the stream closes):
        its caller may have given up on it, and nobody would take the error in."""
        ws = self._ws
        try:
            await self._drop_and_regrant(f"asked for redelivery, request {frame.request_id}")
            await self._send(frame)
        except Exception as e:  # not written (a bug): nothing answers, and what was dropped
            self._awaiting.discard(frame.request_id)  # for it comes back only with a rewind
            await self._attach_again(ws, f"redelivery request {frame.request_id} failed", e)
        except BaseException:  # not written (the stream closes): nothing answers
            self._awaiting.discard(frame.request_id)
            raise
        log.info("%s on %s: %s sent", self._kind, self.topic, frame)

    async def taken(self) -> None:
        """One message was handed to the application: top permits up in halves."""
        self._granted -= 1
        if self._granted <= self._size // 2 and self._ws is not None:
            more = self._size - self._granted
            self._granted = self._size
            await self._send(Flow(permits=more))

    async def nack(self, ids: list[MessageId]) -> None:
        """Ask for these again; on an ordered subscription the broker rewinds and nothing
        newer reaches the application before they do."""
        positions = [(i.ledger_id, i.entry_id) for i in ids]
        if self._ordered:
            await self._ask_again(Nack(message_ids=positions, request_id=next(request_ids)))
        else:
            await self._send(Nack(message_ids=positions))

    async def close(self) -> None:
        """Stop reading and reconnecting, then close what it writes with (acks still
        awaited fail with ClientClosed)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._close_writes()


def to_message(topic: TopicName, frame: MessageFrame, subscription: str | None) -> Message:
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
        subscription=subscription,
    )
