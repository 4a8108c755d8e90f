"""What every WebSocket endpoint of the broker (:mod:`segtxn.broker.ws`,
:mod:`segtxn.broker.producer_endpoint`) shares: the socket it accepts (its frame size
limit, its heartbeat, its place in the set of open sockets), the loop that reads a
client's frames until it leaves, and the hang-up on every client at shutdown.

The loop keeps a connection through bad frames: one that does not decode, or whose handler
raises, is answered with an ``Error`` frame (naming the request it answers), and the next
frame is read. A failure its handler did not name is answered by the rule an HTTP call's is
(:func:`segtxn.failures.known`: ``ServiceNotReady`` when the store or a peer is away or a
ledger's error is retriable, ``PersistenceError`` for damaged data), else as a bug logged
once with an incident id. It is apart from the
endpoints because producers, consumers and readers must all answer the same way.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable

from aiohttp import WSCloseCode, WSMsgType, web

from segtxn.broker.http import SERVICE, SOCKETS
from segtxn.broker.outbox import Outbox
from segtxn.failures import incident, known
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.frames import Error

__all__ = ["check_handshake", "close_sockets", "failure_frame", "new_socket", "receive_frames"]

# its lines are the endpoints' (segtxn.broker.ws): they keep that logger
log = logging.getLogger("segtxn.broker.ws")


async def receive_frames(
    ws: web.WebSocketResponse,
    decode: Callable[[bytes], object],
    handle: Callable[[object], Awaitable[None]],
    outbox: Outbox,
) -> None:
    """Read frames until the client closes; a bad frame gets an Error, not a hang-up."""
    async for message in ws:
        if message.type is WSMsgType.BINARY:
            try:
                frame = decode(message.data)
            except (ValueError, RecursionError) as e:
                # msgspec's DecodeError/ValidationError, bad UTF-8, absurd nesting
                outbox.send(Error(error=ErrorName.INVALID_MESSAGE, message=f"bad frame: {e}"))
                continue
            try:
                await handle(frame)
            except ServerError as e:
                outbox.send(Error(error=e.name, message=e.message, request_id=_request_id(frame)))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a bug, or the store: answered, and the connection stays
                outbox.send(failure_frame(f"{type(frame).__name__} frame", e, _request_id(frame)))
        elif message.type is WSMsgType.TEXT:
            outbox.send(Error(error=ErrorName.INVALID_MESSAGE, message="frames are binary msgpack"))
        elif message.type is WSMsgType.ERROR:
            log.info("websocket error: %s", ws.exception())
            return


def _request_id(frame: object) -> int | None:
    request_id = getattr(frame, "request_id", None)
    return request_id if isinstance(request_id, int) and request_id else None


def failure_frame(what: str, e: Exception, request_id: int | None = None) -> Error:
    """The Error frame for a failure no handler named: what an HTTP call failing so is
    answered (:func:`segtxn.failures.known`: ServiceNotReady when the store or a peer is
    away or a ledger's error is retriable, PersistenceError for damaged data, ...), else a
    bug, logged once with an incident id."""
    named = known(e, what)
    if named is not None:
        return Error(error=named.name, message=named.message, request_id=request_id)
    ident = incident(f"{what} failed", e)
    return Error(
        error=ErrorName.UNKNOWN,
        message=f"internal error, incident {ident} (the broker log has the details)",
        request_id=request_id,
    )


def check_handshake(ws: web.WebSocketResponse, request: web.Request) -> None:
    """Raise ServerError(InvalidArgument) unless ``request`` is a WebSocket handshake
    ``ws`` can accept. An endpoint checks it before it acts: a consumer's attach makes its
    subscription, durably, and a plain GET or HEAD (a browser, a health check, a proxy's
    probe) must do nothing."""
    if not ws.can_prepare(request).ok:
        raise ServerError(
            ErrorName.INVALID_ARGUMENT,
            f"{request.method} {request.path} is a WebSocket endpoint: open it with a "
            "WebSocket handshake (GET with Upgrade: websocket, Connection: Upgrade, "
            "Sec-WebSocket-Key and Sec-WebSocket-Version: 13)",
        )


def new_socket(request: web.Request) -> web.WebSocketResponse:
    limit = request.app[SERVICE].settings.max_message_bytes
    ws = web.WebSocketResponse(max_msg_size=2 * limit + 64 * 1024, heartbeat=30)
    request.app[SOCKETS].add(ws)
    return ws


async def close_sockets(app: web.Application) -> None:
    """On shutdown: hang up on every client (they reconnect elsewhere or later)."""
    sockets: weakref.WeakSet[web.WebSocketResponse] = app[SOCKETS]
    for socket in list(sockets):
        if socket.prepared and not socket.closed:  # some were refused before the upgrade
            await socket.close(code=WSCloseCode.GOING_AWAY, message=b"broker shutting down")
