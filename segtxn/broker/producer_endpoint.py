"""The producer endpoint of the data plane:
``/ws/v2/producer/{domain}/{tenant}/{namespace}/{topic}?name=P[&instance=I]``.

A producer's connection sends ``Send``, ``SendBatch`` and ``Commit`` frames and gets one
``Receipt`` (or one ``Error`` naming its ``seq``) per send, and one answer per commit.
What every endpoint shares (the socket, the frame loop, the HTTP refusals before the
upgrade) is :mod:`segtxn.broker.ws` and :mod:`segtxn.broker.sockets`; this module is what
only a producer does, apart because it is the largest of the endpoints.

Contracts:

- **one connection per producer name** on a topic: another one under a name in use is
  refused ``ProducerBusy``, unless it names the same ``instance`` (the same producer
  reconnecting before the broker saw its old link drop): then the old connection is hung up
  on, its sends in flight are stored, and the resends of them wait for their outcome;
- **stored in arrival order**: sends are published concurrently (one task each, or one
  per run of a batch, up to ``max_pending_sends``: the reading of frames stops while the
  window is full), but each takes its producer's next turn as its frame is read
  (segtxn/broker/ordering.py); a refused send (its transaction not the caller's, say) is
  answered without a turn: nothing of it is stored;
- **bounded memory over all connections**: before its turn, a send takes its payload's
  bytes from the broker's publish buffer, given back once it is answered; the reading of
  frames stops while there is no room (segtxn/broker/publish_budget.py);
- **a receipt only from a broker that holds its id**: one that cannot prove it sends no
  receipt and hangs up on the producer, which sends again once reconnected
  (segtxn/broker/fencing.py);
- **nothing dropped at the hang-up**: when the connection ends, the sends it took in are
  still stored (or refused): the endpoint returns once they are;
- a ``commit`` frame asks for the one-step commit of a transaction
  (segtxn/broker/txncommit.py), answered when decided while later frames go on (a commit
  may wait for sends that come after it); at most :data:`MAX_PENDING_COMMITS` at once,
  one beyond is refused ``TooManyRequests`` with nothing decided; a send
  with a ``traceparent`` gets a span (segtxn/broker/spans.py, docs/tracing.md).

Its log lines keep the ``segtxn.broker.ws`` logger, as the socket loop's do
(docs/verification.md lists them there).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
import weakref
from collections.abc import Coroutine
from typing import Any

from aiohttp import WSCloseCode, web

from segtxn import tracing
from segtxn.aio import Window
from segtxn.auth import close_at_expiry, current_principal, principal_of
from segtxn.broker import fencing, txncommit
from segtxn.broker.arguments import check_batch, check_request_id
from segtxn.broker.http import SERVICE, check_name, error_response, topic_from
from segtxn.broker.ordering import Turn
from segtxn.broker.outbox import Outbox
from segtxn.broker.publish_budget import PublishBudget
from segtxn.broker.publishing import Outcome
from segtxn.broker.sockets import new_socket, receive_frames
from segtxn.broker.spans import send_span, send_span_ends
from segtxn.broker.txnaccess import TxnAccess
from segtxn.inputs import takes
from segtxn.protocol import frames
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.frames import Commit, Error, ProducerReady, Receipt, Send, SendBatch
from segtxn.protocol.txn import TxnId

log = logging.getLogger("segtxn.broker.ws")
_generated = itertools.count(1)
"""Numbers the names of producers that gave none (``<broker id>-<n>``)."""
_connections = itertools.count(1)
"""Numbers producer connections for :class:`~segtxn.broker.intake.Intake` (an int, so it
keeps no closed connection alive)."""

MAX_PENDING_COMMITS = 1000
"""Commit frames of one connection being decided at once (each holds a task, and the
transaction's header, until decided). One beyond is refused ``TooManyRequests`` at once,
nothing decided, rather than waited for as a send beyond the window is: a commit may wait
for sends that come after it on the same connection (docs/protocol.md), which a stopped
reading would keep out. The client then ends the transaction at its coordinator."""

_instances: weakref.WeakKeyDictionary[web.WebSocketResponse, str] = weakref.WeakKeyDictionary()
"""The instance a producer connection named (``instance=``): only the same one takes the
producer's name over from a connection the broker still holds."""
_closing: set[asyncio.Task[bool]] = set()
"""Hang-ups of replaced connections in progress (held so they are not collected)."""


def _close_soon(ws: web.WebSocketResponse) -> None:
    """Hang up on a connection its producer replaced (not awaited: its peer is gone)."""
    task = asyncio.create_task(
        ws.close(code=WSCloseCode.GOING_AWAY, message=b"replaced by its reconnection"),
        name="producer-replaced",
    )
    _closing.add(task)
    task.add_done_callback(_closing.discard)


def _release(turns: list[Turn], budget: PublishBudget, nbytes: int, _: object) -> None:
    for turn in turns:
        turn.release()
    budget.give_back(nbytes)


@takes("name", "instance")
async def producer(request: web.Request) -> web.StreamResponse:
    """Serve one producer's connection until it leaves, as the module docstring says.

    Refused before the upgrade, as an HTTP error (:func:`~segtxn.broker.http.error_response`):
    a bad topic, producer or instance name (``InvalidArgument``), a topic another broker
    holds (``NotOwner``, a redirect), one that cannot be served now (``ServiceNotReady``,
    ``TopicNotFound``...), a name in use by another instance (``ProducerBusy``)."""
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
    if topic.leaving:  # let go as it connected (Topic.check_serving): it reconnects
        await ws.close(code=WSCloseCode.GOING_AWAY, message=b"topic unloaded")
        return ws
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
    window = Window(settings.max_pending_sends)
    connection = next(_connections)
    budget = service.publish_budget
    tasks: set[asyncio.Task[None]] = set()
    committing: set[asyncio.Task[None]] = set()
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
        *,
        unproven: str | None,
    ) -> None:
        """Answer one send. ``unproven``: :func:`fencing.why` at the moment of answering
        (asked once for the sends answered together: it reads the session's clock)."""
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
        if unproven is not None:
            hang_up(unproven)
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
        answer(send, outcome, started, span, unproven=fencing.why(service))

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
        unproven = fencing.why(service)
        for (send, _), outcome, span in zip(items, outcomes, spans, strict=True):
            answer(send, outcome, started, span, unproven=unproven)

    def start(
        work: Coroutine[Any, Any, None], turns: list[Turn], name: str, nbytes: int = 0
    ) -> asyncio.Task[None]:
        """Run ``work``; its ``turns`` and the ``nbytes`` it took of the publish buffer are
        given back as it ends, even if it never ran."""
        task = asyncio.create_task(work, name=name)
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        task.add_done_callback(functools.partial(_release, turns, budget, nbytes))
        return task

    async def admitted(txn: tuple[int, int] | None, sends: list[Send]) -> bool:
        """Refused sends are answered without a turn: nothing of them is stored."""
        refusal = await access.refusal(txn)
        if refusal is None:
            return True
        for send in sends:
            answer(send, refusal, 0.0, unproven=None)  # (a refusal: no receipt to withhold)
        return False

    async def commit(frame: Commit) -> None:
        await txncommit.answer_frame(service, principal_of(request), frame, outbox.send)

    async def handle(frame: object) -> None:
        if isinstance(frame, Commit):  # answered when decided; later frames go on meanwhile
            check_request_id(frame.request_id)
            if len(committing) >= MAX_PENDING_COMMITS:
                outbox.send(
                    Error(
                        error=ErrorName.TOO_MANY_REQUESTS,
                        message=f"{len(committing)} commits of this connection are being "
                        "decided; end the transaction at its coordinator, or ask again later",
                        request_id=frame.request_id,
                    )
                )
                return
            task = start(commit(frame), [], f"commit-{producer_name}-{frame.request_id}")
            committing.add(task)
            task.add_done_callback(committing.discard)
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
        cost = budget.cost(len(frame.payload))
        await budget.take(cost)  # and while the broker's publish buffer is full
        try:
            service.intake.publishing(connection)
            turn = topic.turn(producer_name)  # in arrival order: the order of storage
        except BaseException:
            budget.give_back(cost)
            raise
        start(publish(frame, turn), [turn], f"publish-{producer_name}-{frame.seq}", cost)

    async def handle_together(sends: list[Send]) -> None:
        """Sends of one transaction (or of none) that came together are published together,
        in one task per run of sends the window has room for (Publishing.publish_plain,
        Publishing.publish_txn), and per :func:`~segtxn.broker.intake.Intake.run_size`."""
        run = service.intake.run_size(
            len(sends), transactional=sends[0].txn is not None, connection=connection
        )
        service.intake.publishing(connection)
        items: list[tuple[Send, Turn]] = []
        taken = 0  # of the publish buffer, by ``items``

        def go() -> None:
            nonlocal items, taken
            turns = [t for _, t in items]
            start(publish_together(items), turns, f"publish-{producer_name}", taken)
            items, taken = [], 0

        try:
            for send in sends:
                if items and (window.full or len(items) == run):  # let these go first
                    go()
                    if not window.full:
                        await asyncio.sleep(0)  # its entries reach the ledger, which syncs them
                if not window.try_acquire():  # (no coroutine per send when there is room)
                    await window.acquire()  # backpressure: stop reading while it is full
                cost = budget.cost(len(send.payload))
                if not budget.try_take(cost):
                    if items:  # these first: they give their room back as they end
                        go()
                    await budget.take(cost)  # and while the broker's publish buffer is full
                taken += cost
                items.append((send, topic.turn(producer_name)))  # in arrival order
        except BaseException:  # (none started is left holding its turn or its bytes)
            _release([t for _, t in items], budget, taken, None)
            raise
        go()

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
