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

This module is the send API: what a send, a flush and a close promise their caller, and
how a message is checked, counted in its transaction and queued. The connection that
writes the queued messages, reads their receipts and reconnects (its outage, its failures
for good) is :mod:`segtxn.client.producer_connection`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import Any

from segtxn import tracing
from segtxn.client.closables import Closable
from segtxn.client.errors import ClientClosed, ClientError, MessageTooLarge, Timeout
from segtxn.client.inflight import Pending
from segtxn.client.messages import MessageId, check_outgoing
from segtxn.client.poisoning import poisons
from segtxn.client.producer_connection import ProducerConnection
from segtxn.client.spans import send_span, send_span_ends
from segtxn.client.timeouts import Deadline
from segtxn.client.transaction import Transaction
from segtxn.protocol.errors import ServerError
from segtxn.protocol.frames import Send

__all__ = ["Producer"]

log = logging.getLogger(__name__)


class Producer(ProducerConnection, Closable):
    """Messages to one ``persistent://`` topic or one ``segment://`` (a scalable topic's
    producer, :class:`~segtxn.client.scalable.ScalableProducer`, holds one per segment).
    Get it from ``client.create_producer()``.

    Each message is stored once, in the order sent, across reconnects (the broker
    de-duplicates by producer name and sequence id); at most ``max_pending`` are in flight
    and a send waits for room. ``send`` returns once the message is stored; ``send_async``
    queues it and returns a future, which a transaction's commit waits for."""

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
        if txn is not None and not registered and not txn.joined(self._topic):
            await txn.add_partition(self._topic, deadline)
            self._check_usable()  # closed while it registered
        if not self._in_flight.take_room():
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
        await self._disconnect()
        self._close_done()


def _counted(txn: Transaction | None) -> contextlib.AbstractContextManager[None]:
    """Count a send in ``txn`` from its call until it is tracked (``operations.joining``):
    the application called ``send`` before ``commit``, so the commit must wait for it,
    while it waits for room in a full window too (it was counted only once it had room,
    and a v4 commit went ahead without it: the send then failed, the transaction ended)."""
    return contextlib.nullcontext() if txn is None else txn.operations.joining()
