"""A consumer's acknowledgments: which stream each goes on, alone or in a transaction.

:class:`Acknowledging` is the :class:`~segtxn.client.consumer.Consumer`'s half that the
application acknowledges through (``acknowledge``, ``acknowledge_cumulative``,
``acknowledge_async``). Its contract:

- a message is acknowledged on the stream it came on, as the subscription it was delivered
  to: a message of another subscription, or not a Message/MessageId, is refused before
  anything is sent (ValueError, TypeError);
- a message whose segment was consumed to its end meanwhile (another Failover member took
  the segment over and finished it) is acknowledged already: a plain ack of it succeeds at
  once, one in a transaction is a TransactionConflict (the transaction cannot hold it);
- in a transaction, the ack registers the subscription (once per scalable topic), is
  tracked by the transaction (its commit waits for it, and fails if it failed) and placed
  for the one-step commit; if the transaction does not commit, every stream of the
  consumer asks for its unacknowledged messages again (:meth:`Acknowledging._redeliver_all`);
- the ack's answer is its stream's (:meth:`~segtxn.client.streamwrites.StreamWrites.ack`):
  durable, refused, timed out, or failed with the connection (ConnectionLost).

It is apart from :mod:`segtxn.client.consumer` because acknowledging (and what a
transaction needs of it) is a concern of its own beside attaching and receiving; the
consumer sets the attributes below.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable

from segtxn import tracing
from segtxn.client.connection import Connector
from segtxn.client.errors import Timeout
from segtxn.client.layout import TopicLayout
from segtxn.client.messages import Message, MessageId
from segtxn.client.poisoning import poisons
from segtxn.client.spans import ack_span
from segtxn.client.stream import MessageStream
from segtxn.client.timeouts import Deadline
from segtxn.client.transaction import Transaction
from segtxn.protocol.errors import ErrorCategory, TransactionConflict
from segtxn.protocol.names import Domain, TopicName
from segtxn.protocol.txnops import ack_op

__all__ = ["Acknowledging"]


class Acknowledging:
    """A consumer's acknowledgments (the :class:`~segtxn.client.consumer.Consumer` sets the
    attributes below and says whether it is open: :meth:`_check_open`)."""

    name: str
    subscription: str
    topic: TopicName
    _connector: Connector
    _layout: TopicLayout | None
    _streams: dict[str, MessageStream]
    _finished: set[int]
    """Segments consumed and acknowledged to their end (their streams are closed)."""

    def _check_open(self) -> None:
        """Raises ClientClosed once the consumer is closed."""
        raise NotImplementedError

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
            ConnectionLost: the connection was lost and no broker could be reached for
                the client's ``request_timeout_s``, sooner than the timeout (OUTCOME_UNKNOWN
                if it was written: it may have been applied; RETRIABLE if it was not). A
                connection lost and attached again within that fails nothing: the ack is
                sent again.
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
        if not txn.joined(message_id.topic):
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
        """``txn`` did not commit: every stream asks for its unacknowledged messages again,
        once ``txn`` has let go of its acks (each request within its own operation
        timeout; Timeout, RETRIABLE, if one is not written in it: it is written later)."""
        for stream in list(self._streams.values()):
            deadline = self._deadline(None)  # each stream's request its own limit
            await self._bounded(stream.redeliver(txn), deadline, "redeliver")

    async def _bounded(self, call: Awaitable[None], deadline: Deadline, what: str) -> None:
        """Await ``call`` (a request the stream writes) until ``deadline``; Timeout
        (RETRIABLE) after it."""
        try:
            async with deadline.timeout():
                await call
        except TimeoutError as e:
            raise Timeout(
                f"consumer {self.name}: {what} not sent within {deadline}",
                category=ErrorCategory.RETRIABLE,
            ) from e


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
