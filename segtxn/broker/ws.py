"""WebSocket endpoints of the data plane: producers, consumers and readers.

- ``/ws/v2/producer/{domain}/{tenant}/{namespace}/{topic}?name=P``
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

A producer's sends are published concurrently (one task each, up to ``max_pending_sends``)
but stored in the order they arrive: each takes its producer's next turn as its frame is
read (segtxn/broker/ordering.py). A broker that cannot prove it holds its id sends no
receipt: it hangs up on the producer, which sends again once reconnected
(segtxn/broker/fencing.py). A send or ack frame with a ``traceparent`` gets a span
(segtxn/broker/spans.py, docs/tracing.md). A producer may also ask, with a ``commit``
frame, for the one-step commit of a transaction (segtxn/broker/txncommit.py).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import WSCloseCode, web

from segtxn import tracing
from segtxn.auth import close_at_expiry, current_principal, principal_of, recheck
from segtxn.broker import fencing, txncommit
from segtxn.broker.arguments import check_batch, check_consumer_frame
from segtxn.broker.delivery import ConsumerLink
from segtxn.broker.dispatch import Subscription
from segtxn.broker.http import SERVICE, check_name, error_response, topic_from
from segtxn.broker.members import SubscriptionType
from segtxn.broker.metrics import BrokerMetrics
from segtxn.broker.ordering import Turn
from segtxn.broker.outbox import Outbox
from segtxn.broker.publishing import Outcome
from segtxn.broker.reader import Reader, end_position, start_position
from segtxn.broker.sockets import failure_frame, new_socket, receive_frames
from segtxn.broker.spans import ack_span, send_span, send_span_ends
from segtxn.broker.txnaccess import TxnAccess
from segtxn.ledger import Position
from segtxn.protocol import frames
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.frames import (
    Ack,
    Commit,
    Error,
    Flow,
    Frame,
    Nack,
    ProducerReady,
    Receipt,
    Redeliver,
    Send,
    SendBatch,
)
from segtxn.protocol.names import Domain, TopicName
from segtxn.protocol.txn import TxnId

log = logging.getLogger(__name__)
_generated = itertools.count(1)
_instances: weakref.WeakKeyDictionary[web.WebSocketResponse, str] = weakref.WeakKeyDictionary()
"""The instance a producer connection named (``instance=``): only the same one takes the
producer's name over from a connection the broker still holds."""
_closing: set[asyncio.Task[bool]] = set()


def _close_soon(ws: web.WebSocketResponse) -> None:
    """Hang up on a connection its producer replaced (not awaited: its peer is gone)."""
    task = asyncio.create_task(
        ws.close(code=WSCloseCode.GOING_AWAY, message=b"replaced by its reconnection"),
        name="producer-replaced",
    )
    _closing.add(task)
    task.add_done_callback(_closing.discard)


def _nothing() -> None:
    """Nothing to do (yet): a connection refused before its upgrade has no expiry."""


# ---------------------------------------------------------------------- producer


def _release(turns: list[Turn], _: object) -> None:
    for turn in turns:
        turn.release()


async def producer(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE]
    held: object | None = None
    try:
        name = topic_from(request)
        producer_name = check_name(
            "producer", request.query.get("name") or f"{service.broker_id}-{next(_generated)}"
        )
        instance = request.query.get("instance", "")
        if instance:
            check_name("producer instance", instance)
        topic = await service.serve(name)
        held = topic.producers.get(producer_name)
        ours = isinstance(held, web.WebSocketResponse) and _instances.get(held) == instance
        if held is not None and not (instance and ours):
            raise ServerError(
                ErrorName.PRODUCER_BUSY, f"producer {producer_name!r} is already connected"
            )
    except ServerError as e:
        return error_response(e, request)
    ws = new_socket(request)
    await ws.prepare(request)
    expiry = close_at_expiry(request, ws)
    if isinstance(held, web.WebSocketResponse) and topic.producers.get(producer_name) is held:
        # The same producer again (its instance): it saw its old connection drop, which the
        # broker may not see for a heartbeat (30 s) yet. That one goes; its sends in
        # flight are stored, and the resends of them wait for their outcome.
        log.info("%s: producer %s reconnected; its old connection goes", name, producer_name)
        _close_soon(held)
    topic.producers[producer_name] = ws
    if instance:
        _instances[ws] = instance
    log.info("%s: producer %s connected (from %s)", name, producer_name, request.remote)
    settings = service.settings
    outbox = Outbox(ws, settings.max_pending_sends + 64, f"producer-{producer_name}")
    outbox.start()
    window = asyncio.Semaphore(settings.max_pending_sends)
    tasks: set[asyncio.Task[None]] = set()
    access = TxnAccess(service, functools.partial(current_principal, request))
    outbox.send(
        ProducerReady(
            producer_name=producer_name,
            last_sequence_id=topic.dedup.state(producer_name).last_taken,
            max_message_bytes=settings.max_message_bytes,
        )
    )

    metrics = service.metrics
    fenced: list[str] = []
    """Why this connection was hung up on instead of getting a receipt (once)."""

    async def close_fenced() -> None:
        await ws.close(code=WSCloseCode.GOING_AWAY, message=b"broker fenced")

    def hang_up(why: str) -> None:
        """A stored send, and the broker cannot prove it holds its id: no receipt (the
        topic may be another broker's now); the producer sends it again once reconnected."""
        fenced.append(why)
        log.warning(
            "%s: producer %s: no receipt from a broker that cannot prove it holds its id "
            "(%s); hanging up (it sends again once reconnected)",
            name, producer_name, why,
        )  # fmt: skip
        closing = asyncio.create_task(close_fenced(), name=f"hang-up-{producer_name}")
        tasks.add(closing)
        closing.add_done_callback(tasks.discard)

    def answer(
        send: Send,
        outcome: Outcome | ServerError,
        started: float,
        span: tracing.Span | None = None,
    ) -> None:
        if span is not None:
            send_span_ends(span, outcome)
        if isinstance(outcome, ServerError):
            metrics.errors.add(1, {"error": outcome.name.value})
            outbox.send(Error(error=outcome.name, message=outcome.message, seq=send.seq))
            if send.txn is not None:
                service.op_records.refused(TxnId(*send.txn), outcome.message)
            return
        if fenced:
            return
        why = fencing.why(service)
        if why is not None:
            hang_up(why)
            return
        position, duplicate = outcome
        if duplicate:
            metrics.duplicates.add(1)
        else:
            metrics.messages_in.add(1)
            metrics.bytes_in.add(len(send.payload))
            metrics.publish_latency.record(time.perf_counter() - started)
        outbox.send(
            Receipt(
                seq=send.seq,
                message_id=(position.ledger_id, position.entry_id),
                duplicate=duplicate,
            )
        )

    async def publish(send: Send, turn: Turn) -> None:
        started = time.perf_counter()
        span = send_span(name, producer_name, send)
        try:
            with tracing.current(span):
                outcome: Outcome | ServerError = await topic.publish(producer_name, send, turn)
        except ServerError as e:
            outcome = e
        finally:
            window.release()
        answer(send, outcome, started, span)

    async def publish_together(items: list[tuple[Send, Turn]]) -> None:
        started = time.perf_counter()
        spans = [send_span(name, producer_name, send) for send, _ in items]
        try:
            if items[0][0].txn is None:
                outcomes = await topic.publish_plain(producer_name, items)
            else:
                outcomes = await topic.publish_txn(producer_name, items)
        finally:
            for _ in items:
                window.release()
        for (send, _), outcome, span in zip(items, outcomes, spans, strict=True):
            answer(send, outcome, started, span)

    def start(work: Coroutine[Any, Any, None], turns: list[Turn], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        task.add_done_callback(functools.partial(_release, turns))  # even if it never ran

    async def admitted(txn: tuple[int, int] | None, sends: list[Send]) -> bool:
        """Refused sends are answered without a turn: nothing of them is stored."""
        refusal = await access.refusal(txn)
        if refusal is None:
            return True
        for send in sends:
            answer(send, refusal, 0.0)
        return False

    async def commit(frame: Commit) -> None:
        outbox.send(await txncommit.answer_frame(service, principal_of(request), frame))

    async def handle(frame: object) -> None:
        if isinstance(frame, Commit):  # answered when decided; later frames go on meanwhile
            start(commit(frame), [], f"commit-{producer_name}-{frame.request_id}")
            return
        if isinstance(frame, SendBatch):
            check_batch(frame.sends)
            for txn, run in itertools.groupby(frame.sends, key=lambda send: send.txn):
                sends = list(run)
                if await admitted(txn, sends):
                    await handle_together(sends)
            return
        assert isinstance(frame, Send)
        if not await admitted(frame.txn, [frame]):
            return
        await window.acquire()  # backpressure: stop reading while the window is full
        turn = topic.turn(producer_name)  # in arrival order: the order of storage
        start(publish(frame, turn), [turn], f"publish-{producer_name}-{frame.seq}")

    async def handle_together(sends: list[Send]) -> None:
        """Sends of one transaction (or of none) that came together are published together,
        in one task per run of sends the window has room for (Publishing.publish_plain,
        Publishing.publish_txn)."""
        items: list[tuple[Send, Turn]] = []
        for send in sends:
            if items and window.locked():  # let these go before waiting for room
                start(publish_together(items), [t for _, t in items], f"publish-{producer_name}")
                items = []
            await window.acquire()  # backpressure: stop reading while the window is full
            items.append((send, topic.turn(producer_name)))  # in arrival order
        start(publish_together(items), [t for _, t in items], f"publish-{producer_name}")

    try:
        await receive_frames(ws, frames.producer_input.decode, handle, outbox)
    finally:
        expiry()
        if topic.producers.get(producer_name) is ws:
            del topic.producers[producer_name]
        await asyncio.gather(*tasks, return_exceptions=True)  # stored either way
        await outbox.close()
        log.info(
            "%s: producer %s disconnected (%s)",
            name,
            producer_name,
            "closed" if ws.close_code == WSCloseCode.OK else f"close code {ws.close_code}",
        )
    return ws


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


async def consumer(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE]
    ws = new_socket(request)
    link: ConsumerLink | None = None
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
        link = ConsumerLink(
            consumer_name,
            _counting(outbox, service.metrics),
            lambda: ws.close(code=WSCloseCode.GOING_AWAY, message=b"topic unloaded"),
        )
        # attach queues ConsumerReady, the first frame, before anything else for the link
        subscription = await topic.attach(subscription_name, link, sub_type, initial)
    except ServerError as e:
        return error_response(e, request)
    expiry: Callable[[], None] = _nothing
    try:
        await ws.prepare(request)
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
                on_segment = TopicName.parse(subscription.ledger.name).domain is Domain.SEGMENT
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


async def reader(request: web.Request) -> web.StreamResponse:
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
