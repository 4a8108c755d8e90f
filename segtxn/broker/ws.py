"""WebSocket endpoints of the data plane: producers, consumers and readers.

- ``/ws/v2/producer/{domain}/{tenant}/{namespace}/{topic}?name=P``
  (:mod:`segtxn.broker.producer_endpoint`);
- ``/ws/v2/consumer/{domain}/{tenant}/{namespace}/{topic}/{subscription}?type=&initial=&name=``
- ``/ws/v2/reader/{domain}/{tenant}/{namespace}/{topic}?start=earliest|latest|L:E``

Problems known before the upgrade (bad names, unknown topics, another broker's topic,
a busy subscription) are answered as HTTP errors with the JSON body
``{"error": NAME, "message": ...}`` (``NotOwner`` is a 307 with ``Location``). After the
upgrade every problem with one frame is an ``Error`` frame, and the connection goes on.
Frames larger than twice the message limit close the connection with WebSocket code 1009.
The socket, the frame loop and the shutdown hang-up the endpoints share:
segtxn/broker/sockets.py.

Each connection writes through one sender task and a bounded queue
(segtxn/broker/outbox.py), so slow sockets never block a dispatcher; a consumer's queue is
larger than the permits it may hold. What is queued while the sender writes goes out
together: consecutive receipts in one
``ReceiptBatch``, consecutive messages in one ``MessageBatch`` (one WebSocket message and
one write instead of one per message; the client unpacks them in order).

A consumer or a reader is hung up on (1001, "topic unloaded") when its topic is unloaded
or deleted here, and reconnects (:meth:`segtxn.broker.topic.Topic.disconnect_clients`). An
ack frame with a ``traceparent`` gets a span (segtxn/broker/spans.py, docs/tracing.md).
What only a producer does (the order of storage, fencing, one-step commits) is
:mod:`segtxn.broker.producer_endpoint`.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Callable

from aiohttp import WSCloseCode, web

from segtxn import tracing
from segtxn.auth import close_at_expiry, current_principal, recheck
from segtxn.broker.arguments import check_consumer_frame
from segtxn.broker.delivery import ConsumerLink
from segtxn.broker.dispatch import Subscription
from segtxn.broker.http import SERVICE, check_name, error_response, topic_from
from segtxn.broker.members import SubscriptionType
from segtxn.broker.metrics import BrokerMetrics
from segtxn.broker.outbox import Outbox
from segtxn.broker.reader import Reader, end_position, start_position
from segtxn.broker.sockets import check_handshake, failure_frame, new_socket, receive_frames
from segtxn.broker.spans import ack_span
from segtxn.broker.txnaccess import TxnAccess
from segtxn.inputs import takes
from segtxn.ledger import Position
from segtxn.protocol import frames
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.frames import (
    Ack,
    Error,
    Flow,
    Frame,
    Nack,
    Redeliver,
)
from segtxn.protocol.names import Domain, TopicName
from segtxn.protocol.txn import TxnId

_generated = itertools.count(1)
"""Numbers the names of consumers and readers that gave none."""


def _nothing() -> None:
    """Nothing to do (yet): a connection refused before its upgrade has no expiry."""


# ---------------------------------------------------------------------- consumer


def _counting(outbox: Outbox, metrics: BrokerMetrics) -> Callable[[Frame], None]:
    def send(frame: Frame) -> None:
        if isinstance(frame, frames.Message):
            metrics.messages_out.add(1)
            metrics.bytes_out.add(len(frame.payload))
        outbox.send(frame)

    return send


def _parse_type(value: str) -> SubscriptionType:
    try:
        return SubscriptionType(value)
    except ValueError:
        known = ", ".join(t.value for t in SubscriptionType)
        raise ServerError(
            ErrorName.INVALID_ARGUMENT, f"subscription type {value!r}: one of {known}"
        ) from None


def _parse_initial(value: str) -> str:
    if value not in ("earliest", "latest"):
        raise ServerError(ErrorName.INVALID_ARGUMENT, "initial position: earliest or latest")
    return value


@takes("type", "initial", "name")
async def consumer(request: web.Request) -> web.StreamResponse:
    """Serve one consumer of a subscription (made at ``initial`` if it does not exist;
    ``Exclusive`` unless ``type`` says otherwise) until it leaves: messages as its
    ``Flow`` permits allow, its acks answered once durable, nacks and redeliveries.

    Refused before the upgrade, as an HTTP error: a bad name, type or initial position
    (``InvalidArgument``), a topic another broker holds (``NotOwner``), one that cannot be
    served now, an Exclusive subscription taken already (``ConsumerBusy``). On leaving, a
    clean close (1000) detaches it at once; a Failover member whose connection dropped
    keeps its place ``consumer_hold_s`` for its return (:meth:`Subscription.detach`)."""
    service = request.app[SERVICE]
    ws = new_socket(request)
    link: ConsumerLink | None = None
    upgraded = False

    async def hang_up() -> None:
        """Hang up as the topic is let go. The consumer is attached before the upgrade (a
        refusal is an HTTP answer), and there is no socket to close before it: the
        endpoint then hangs up itself once upgraded (it looks at ``topic.leaving``)."""
        if upgraded:
            await ws.close(code=WSCloseCode.GOING_AWAY, message=b"topic unloaded")

    try:
        name = topic_from(request)
        subscription_name = check_name("subscription", request.match_info["subscription"])
        sub_type = _parse_type(request.query.get("type", "Exclusive"))
        initial = _parse_initial(request.query.get("initial", "latest"))
        consumer_name = check_name(
            "consumer", request.query.get("name") or f"consumer-{next(_generated)}"
        )
        topic = await service.serve(name)
        outbox = Outbox(ws, service.settings.max_permits + 64, f"consumer-{consumer_name}")
        link = ConsumerLink(consumer_name, _counting(outbox, service.metrics), hang_up)
        check_handshake(ws, request)  # a plain GET or HEAD must not make the subscription
        # attach queues ConsumerReady, the first frame, before anything else for the link
        subscription = await topic.attach(subscription_name, link, sub_type, initial)
    except ServerError as e:
        return error_response(e, request)
    expiry: Callable[[], None] = _nothing
    try:
        await ws.prepare(request)
        upgraded = True
        if topic.leaving:  # let go since it was attached: its hang-up found no socket
            await hang_up()
            return ws
        expiry = close_at_expiry(request, ws)
        outbox.start()
        await _serve_consumer(
            ws,
            subscription,
            link,
            outbox,
            TxnAccess(service, functools.partial(current_principal, request)),
            allowed=functools.partial(recheck, request),
            refused=service.op_records.refused,
        )
    finally:
        expiry()
        # a clean close (1000) leaves at once; anything else may be a consumer coming back
        subscription.detach(link, dropped=ws.close_code != WSCloseCode.OK)
        await outbox.close()
    return ws


async def _serve_consumer(
    ws: web.WebSocketResponse,
    subscription: Subscription,
    link: ConsumerLink,
    outbox: Outbox,
    access: TxnAccess,
    *,
    allowed: Callable[[], None],
    refused: Callable[[TxnId, str], None],
) -> None:
    """Serve a consumer's frames; ``allowed`` raises NotAuthorized when the policy in force
    no longer lets its role consume on this subscription (each frame is then refused);
    ``refused`` is told of a transactional ack refused (its transaction cannot commit in
    one step here)."""
    acks: set[asyncio.Task[None]] = set()
    # (the subscription's segment does not change: not parsed again for every ack)
    on_segment = (
        TopicName.parse(subscription.ledger.name, check_lengths=False).domain is Domain.SEGMENT
    )

    async def ack(frame: Ack) -> None:
        ids = [Position(*i) for i in frame.message_ids]
        span = ack_span(subscription.ledger.name, subscription.name, frame)
        try:
            with tracing.current(span):
                await acknowledge(frame, ids)
        except BaseException as e:
            tracing.end(span, e)
            raise
        tracing.end(span)

    async def acknowledge(frame: Ack, ids: list[Position]) -> None:
        try:
            if frame.txn is None:
                await subscription.ack(link, ids, cumulative=frame.cumulative)
            else:
                txn = TxnId(*frame.txn)
                if txn.is_v5 != on_segment:
                    raise ServerError(
                        ErrorName.NOT_ALLOWED,
                        f"{txn} is a v{5 if txn.is_v5 else 4} transaction; "
                        f"{subscription.ledger.name} takes v{5 if on_segment else 4} ones",
                    )
                await access.check(txn)
                await subscription.txn_ack(
                    link, txn, ids, cumulative=frame.cumulative, epoch=frame.epoch
                )
            if frame.request_id:
                outbox.send(frames.AckReceipt(request_id=frame.request_id))
        except ServerError as e:
            outbox.send(Error(error=e.name, message=e.message, request_id=frame.request_id))
            if frame.txn is not None:
                refused(TxnId(*frame.txn), e.message)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            outbox.send(failure_frame("ack", e, frame.request_id))

    async def handle(frame: object) -> None:
        allowed()
        if isinstance(frame, Ack | Nack | Redeliver):
            check_consumer_frame(frame)
        if isinstance(frame, Flow):
            subscription.flow(link, frame.permits)
        elif isinstance(frame, Ack):
            task = asyncio.create_task(ack(frame), name=f"ack-{link.name}")
            acks.add(task)
            task.add_done_callback(acks.discard)
        elif isinstance(frame, Nack):
            subscription.nack(link, [Position(*i) for i in frame.message_ids], frame.request_id)
        elif isinstance(frame, Redeliver):
            txn = None if frame.txn is None else TxnId(*frame.txn)
            if txn is not None:
                await access.check(txn)
            subscription.redeliver(link, frame.request_id, txn)

    try:
        await receive_frames(ws, frames.consumer_input.decode, handle, outbox)
    finally:
        await asyncio.gather(*acks, return_exceptions=True)


# ---------------------------------------------------------------------- reader


@takes("start", "end")
async def reader(request: web.Request) -> web.StreamResponse:
    """Serve one reader (:mod:`segtxn.broker.reader`: no cursor, nothing acknowledged)
    from ``start`` to ``end`` if given, as its ``Flow`` permits allow, until it leaves.

    Refused before the upgrade, as an HTTP error: a bad ``start`` or ``end``, a start
    beyond the topic's end (``InvalidArgument``), a topic another broker holds
    (``NotOwner``), one that cannot be served now. Any other frame than ``Flow`` is
    answered ``NotAllowed``."""
    service = request.app[SERVICE]
    ws = new_socket(request)
    try:
        name = topic_from(request)
        topic = await service.serve(name)
        start = start_position(topic.ledger, request.query.get("start", "latest"))
        end = end_position(topic.ledger, request.query.get("end"))
    except ServerError as e:
        return error_response(e, request)
    await ws.prepare(request)
    if topic.leaving:  # let go as the reader connected: not to be read from a closed ledger
        await ws.close(code=WSCloseCode.GOING_AWAY, message=b"topic unloaded")
        return ws
    expiry = close_at_expiry(request, ws)
    outbox = Outbox(ws, service.settings.max_permits + 64, f"reader-{name}")
    outbox.start()
    link = ConsumerLink(
        f"reader-{next(_generated)}",
        outbox.send,
        lambda: ws.close(code=WSCloseCode.GOING_AWAY, message=b"topic unloaded"),
    )
    session = Reader(
        topic.ledger,
        topic.buffer,
        link,
        start,
        batch=service.settings.dispatch_batch,
        max_permits=service.settings.max_permits,
        end=end,
    )

    async def handle(frame: object) -> None:
        recheck(request)  # the policy in force now: it may have been reloaded
        if isinstance(frame, Flow):
            session.flow(frame.permits)
        else:
            raise ServerError(ErrorName.NOT_ALLOWED, "a reader does not acknowledge")

    topic.readers.add(link)  # (a topic with readers is not unloaded for being idle)
    try:
        await receive_frames(ws, frames.consumer_input.decode, handle, outbox)
    finally:
        expiry()
        topic.readers.discard(link)
        await session.close()
        await outbox.close()
    return ws
