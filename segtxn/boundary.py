"""The error boundary of segtxn's HTTP servers (brokers and coordinators).

Every request either succeeds or gets the documented error: the JSON body
``{"error": NAME, "message": ...}`` with the ``X-Segtxn-Error`` / ``X-Segtxn-Message`` headers
(docs/protocol.md). One middleware per application turns whatever a handler raises into
that answer:

- a query parameter given twice: 400 ``InvalidArgument`` before the handler runs
  (:func:`segtxn.inputs.check_query`); one the route does not take, 400 too, but after
  authentication (:func:`segtxn.inputs.install_declared_check`);
- :class:`ServerError`: its name and status (4xx: the client's fault; 503: try again);
- aiohttp's own refusals, with their status: unknown path 404 and oversized body 413
  (``InvalidArgument``, ``MessageTooLarge``), wrong method 405 (``NotAllowed``), an
  ``Expect:`` other than ``100-continue`` 417 (``InvalidArgument``; raised before any
  middleware, answered by :func:`answering_refusals`);
- the metadata store being unreachable, closed, or the session gone: 503 ServiceNotReady;
- the metadata store full (etcd's NOSPACE alarm): 503 ``MetadataStoreFull``, whose message
  tells the operator what to do; not retriable (it lasts until someone acts), and logged
  at ERROR once per :data:`segtxn.failures.STORE_FULL_LOG_EVERY_S`, not once per request;
- the metadata store refusing the server's own credentials after start-up (its etcd
  user's permission revoked, its password changed): 503 ``StoreAccessDenied`` with the
  store's reason; not retriable either, and logged once per cause by the store client
  (:attr:`segtxn.metastore.engine.Engine.denied`), which also makes ``/readyz`` say not
  ready;
  a peer server unreachable or slow: 503 ServiceNotReady;
- stored data damaged, missing, or not its own (a ledger file of another cluster's volume,
  a wrong restore: :class:`~segtxn.ledger.errors.LedgerCorrupted` and its
  ``LedgerMismatch``, ``LedgerMissing``), or a topic's record in the metadata store that
  does not decode (:class:`~segtxn.topics.model.DamagedRecord`), met by a call that does
  not say so itself (a topic delete on a foreign volume, a lookup): 500
  ``PersistenceError`` whose message names the ledger and the file, or the record's key,
  logged at ERROR once per file or record and without a traceback (it is a known
  condition that lasts until an operator acts, not a bug);
- a storage failure that doing the call again may get past (a ledger's retriable
  ``LedgerError``: a file a deletion could not remove, too few replicas, a full disk, a
  write or a cursor's save that met another owner's fence) not answered by the call
  itself: 503 ServiceNotReady with its message (the path, the system's words), logged at
  WARNING without a traceback;
- a body aiohttp cannot read (it does not decompress as its ``Content-Encoding`` says):
  400 ``InvalidArgument``, and the connection closes; one in an encoding aiohttp does not
  decode (``compress``, ``br`` without its package, a list): 415 ``InvalidArgument``
  (:class:`~segtxn.inputs.UnsupportedEncoding`), before it is read (the connection closes
  where aiohttp would decode the body all the same: nothing logged at ERROR);
- anything else is a bug: 500 ``UnknownError`` (``MetadataError`` for a store refusal) whose
  message carries an *incident id*; the log has the same id and the traceback. The body never
  has a stack trace.

Once a handler has started its response (a WebSocket upgraded, a stream begun), no HTTP
answer can follow it on that connection: a failure then closes a WebSocket with a close
frame instead, whose code says what kind of failure it was and whose reason is
``"NAME: message"`` cut to the 123 bytes a close frame holds: 1013 (try again later) for
ServiceNotReady, 1008 (policy violation) for the client's fault, 1011 (internal error) for a
bug, with the incident id (the same rule names the failure:
:func:`segtxn.failures.known`, by which a broker's sockets also answer a frame's failure).
Any other started response is cut off (the connection closed), so the client cannot take
it for a complete one. :func:`install` puts
the boundary on an application: the middleware, and the hook that tells it a response was
started.

Requests aiohttp refuses before any handler runs (malformed HTTP, a request line or header
longer than :data:`~segtxn.protocol.limits.MAX_LINE_BYTES`, too many headers) are answered
by :class:`JsonRequestHandler` in the same shape: 431 for the sizes, 400 for the rest, and
logged at INFO in one line, since a client's mistake is not the server's error.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from aiohttp import WSCloseCode, hdrs, web
from aiohttp.http_exceptions import ContentEncodingError, LineTooLong

from segtxn import inputs, tracing
from segtxn.failures import incident, known
from segtxn.metastore import (
    MetadataStoreError,
)
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.limits import (
    MAX_ERROR_MESSAGE_CHARS,
    MAX_HEADERS,
    MAX_LINE_BYTES,
)

log = logging.getLogger(__name__)
STARTED = web.RequestKey("segtxn-started-response", web.StreamResponse)
"""The response a handler has started (prepared) for a request, if any."""
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ServerHandler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]

HANDLER_ARGS: dict[str, Any] = {
    "max_line_size": MAX_LINE_BYTES,
    "max_field_size": MAX_LINE_BYTES,
    "max_headers": MAX_HEADERS,
}
"""aiohttp's request-parser limits, spelled out (they are its defaults)."""


def _cut(message: str) -> str:
    if len(message) <= MAX_ERROR_MESSAGE_CHARS:
        return message
    return message[:MAX_ERROR_MESSAGE_CHARS] + "... (cut)"


MAX_HEADER_MESSAGE_BYTES = 2048
"""``X-Segtxn-Message`` is cut here once quoted (clients refuse header lines over 8190)."""


def header_text(message: str) -> str:
    """``message`` as an ``X-Segtxn-Message`` header's value: quoted, and cut at
    :data:`MAX_HEADER_MESSAGE_BYTES`."""
    quoted = quote(message, errors="backslashreplace")
    if len(quoted) <= MAX_HEADER_MESSAGE_BYTES:
        return quoted
    cut = quoted[: MAX_HEADER_MESSAGE_BYTES - 12]
    cut = cut[: cut.rfind("%")] if "%" in cut[-2:] else cut  # no half an escape
    return cut + "...%20(cut)"


def error_response(
    error: ServerError, request: web.BaseRequest | None = None, *, status: int | None = None
) -> web.Response:
    """``{"error": NAME, "message": ...}`` with the name's HTTP status (or ``status``);
    ``NotOwner`` is a 307 whose ``Location`` is the same path and query on the serving broker.
    Long messages are cut: they often quote the request back. A body in an encoding not
    decoded (:class:`~segtxn.inputs.UnsupportedEncoding`) is a 415. The answer to a body
    that did not arrive in time (:class:`~segtxn.inputs.BodyNotArrived`), and to one in an
    encoding not decoded that aiohttp would decode all the same (its ``closes``), closes the
    connection: the body was not all read."""
    message = _cut(error.message)
    # also in headers: a failed WebSocket handshake shows the client headers, not the body
    headers = {
        "X-Segtxn-Error": error.name.value,
        "X-Segtxn-Message": header_text(message),
    }
    if error.name is ErrorName.NOT_OWNER and error.redirect and request is not None:
        headers["Location"] = error.redirect.rstrip("/") + request.path_qs
    if status is None and isinstance(error, inputs.UnsupportedEncoding):
        status = inputs.UNSUPPORTED_ENCODING_STATUS
    response = web.Response(
        status=status or error.name.http_status,
        text=json.dumps({"error": error.name.value, "message": message}),  # ASCII: \u escapes
        content_type="application/json",
        headers=headers,
    )
    if isinstance(error, inputs.BodyNotArrived) or (
        isinstance(error, inputs.UnsupportedEncoding) and error.closes
    ):
        response.force_close()
    return response


ELSEWHERE = web.AppKey("served-elsewhere", dict[str, str])
"""Path prefixes another kind of server serves, and what to tell a client that asked this
one (see :func:`install`)."""


_REFUSALS = {
    404: ErrorName.INVALID_ARGUMENT,
    405: ErrorName.NOT_ALLOWED,
    413: ErrorName.MESSAGE_TOO_LARGE,
}


def _refusal(request: web.Request, e: web.HTTPException) -> web.Response:
    """One of aiohttp's own answers (no route, wrong method, body too large, bad upgrade)."""
    name = _REFUSALS.get(e.status, ErrorName.INVALID_ARGUMENT)
    if e.status == 404:
        message = f"no such endpoint: {request.method} {request.path}"
        if request.raw_path.partition("?")[0] != request.path:  # "..", "//", escapes
            message += f" (as written: {request.raw_path.partition('?')[0]})"
        elsewhere = request.app.get(ELSEWHERE, {})
        served = next((p for p in elsewhere if request.path.startswith(p)), None)
        if served is not None:
            message += f": {elsewhere[served]}"
    elif e.status == 405:
        allowed = ", ".join(sorted(getattr(e, "allowed_methods", ()) or ()))
        message = f"{request.method} is not allowed on {request.path} (allowed: {allowed})"
    elif e.status == 417:
        expect = request.headers.get(hdrs.EXPECT, "")
        message = (
            f"Expect: {expect[:80]!r} is not an expectation this server meets "
            "(only 100-continue is)"
        )
    else:
        message = e.text or e.reason
    return error_response(ServerError(name, message), request, status=e.status)


def answering_refusals(handler: ServerHandler) -> ServerHandler:
    """An application's request handler (what aiohttp's server calls for each request:
    ``web.Server.request_handler``) whose refusals raised before the application's
    middlewares run get the JSON error too: an ``Expect:`` header other than
    ``100-continue`` is refused 417 by aiohttp's router before any middleware (so before
    the :func:`boundary`), which answered it in plain text. Keeps its status, named
    ``InvalidArgument``, as the other refusals of HTTP's own (:func:`_refusal`)."""

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as e:
            if e.status < 400 or e.content_type == "application/json":
                raise
            if not isinstance(request, web.Request):  # (an application's requests are)
                raise
            return _refusal(request, e)

    return handle


def install(app: web.Application, elsewhere: dict[str, str] | None = None) -> None:
    """Put the error boundary on ``app`` (before it starts): the :func:`boundary`
    middleware, and the hook that records each started response for it.

    ``elsewhere``: path prefixes that another kind of segtxn server serves, each with a
    sentence saying so, added to the "no such endpoint" answer of a path under it (a
    client given a coordinator's URL for a broker's, or the other way round)."""
    app.middlewares.append(boundary)
    app.on_response_prepare.append(_started)
    app[ELSEWHERE] = elsewhere or {}


async def _started(request: web.Request, response: web.StreamResponse) -> None:
    request[STARTED] = response


@web.middleware
async def boundary(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The error boundary: see the module docstring. Install it with :func:`install`
    (without the hook it cannot tell a failure after a WebSocket upgrade)."""
    try:
        inputs.check_query(request)
        return await handler(request)
    except asyncio.CancelledError:
        raise
    except Exception as e:
        started = request.get(STARTED)
        if started is not None and started.prepared:
            return await _after_start(request, started, e)
        if isinstance(e, ServerError):
            return error_response(e, request)
        if isinstance(e, web.HTTPException):
            if e.status < 400 or e.content_type == "application/json":
                raise  # redirects, and answers that already have the JSON shape
            return _refusal(request, e)
        named = known(e, f"{request.method} {request.path}")
        if named is not None:
            return error_response(named, request)
        if isinstance(e, web.RequestPayloadError):
            return _unreadable_body(request, e)
        if isinstance(e, ConnectionResetError) and _gone(request):
            log.debug("%s %s: the client went away mid-request", request.method, request.path)
            return error_response(
                ServerError(ErrorName.INVALID_ARGUMENT, "the client went away mid-request"),
                request,
            )
        return error_response(_bug(request, e), request)


def _unreadable_body(request: web.Request, e: web.RequestPayloadError) -> web.Response:
    """400 for a body aiohttp could not read (it does not decompress as its
    ``Content-Encoding`` says, its chunks are malformed): the client's mistake, logged at
    INFO. The connection closes after the answer: what follows the body on it cannot be
    told apart. The body is marked read, or aiohttp would drain the rest of it after the
    answer, meet the same error again and log it as "Unhandled exception"."""
    cause = e.__cause__
    reason = " ".join(str(getattr(cause, "message", None) or e).split())
    log.info("%s %s: the body cannot be read: %s", request.method, request.path, reason)
    request.content.feed_eof()
    response = error_response(
        ServerError(ErrorName.INVALID_ARGUMENT, f"the body cannot be read: {reason}"), request
    )
    response.force_close()
    return response


def _gone(request: web.Request) -> bool:
    """Whether the client's connection is closed (reading its body then fails with
    ConnectionResetError: the client's doing, not a bug to log with a traceback)."""
    transport = request.transport
    return transport is None or transport.is_closing()


def _bug(request: web.Request, e: Exception) -> ServerError:
    """A failure that is a bug: logged once with a fresh incident id and its traceback."""
    ident = incident(f"{request.method} {request.path_qs} failed", e)
    name = ErrorName.METADATA if isinstance(e, MetadataStoreError) else ErrorName.UNKNOWN
    return ServerError(name, f"internal error, incident {ident} (the server log has the details)")


MAX_CLOSE_REASON_BYTES = 123
"""A close frame's payload is at most 125 bytes, two of them the code (RFC 6455, 5.5)."""


def close_code(error: ServerError) -> WSCloseCode:
    """The WebSocket close code for a failure after the upgrade: 1013 (try again later)
    for a retriable name, 1011 (internal error) for a server's 5xx, else 1008 (the
    client's fault)."""
    if error.retriable:
        return WSCloseCode.TRY_AGAIN_LATER
    if error.name.http_status >= 500:
        return WSCloseCode.INTERNAL_ERROR
    return WSCloseCode.POLICY_VIOLATION


def close_reason(error: ServerError) -> bytes:
    """``"NAME: message"`` as UTF-8, cut to :data:`MAX_CLOSE_REASON_BYTES` (never in the
    middle of a character)."""
    text = f"{error.name.value}: {error.message}".encode("utf-8", "backslashreplace")
    if len(text) <= MAX_CLOSE_REASON_BYTES:
        return text
    cut = text[: MAX_CLOSE_REASON_BYTES - 3].decode("utf-8", "ignore").encode("utf-8")
    return cut + b"..."


async def _after_start(
    request: web.Request, response: web.StreamResponse, e: Exception
) -> web.StreamResponse:
    """A handler failed after its response started: close a WebSocket with a code and a
    reason; cut any other response off (no HTTP can follow what was sent)."""
    if isinstance(e, ServerError):
        error = e
    elif isinstance(e, web.HTTPException):
        fallback = ErrorName.INVALID_ARGUMENT if e.status < 500 else ErrorName.UNKNOWN
        error = ServerError(_REFUSALS.get(e.status, fallback), e.text or e.reason)
    else:
        error = known(e, f"{request.method} {request.path}") or _bug(request, e)
    if not isinstance(response, web.WebSocketResponse):
        log.warning(
            "%s %s failed after its response started (%s); connection closed",
            request.method,
            request.path,
            error,
        )
        if request.transport is not None:
            request.transport.close()
        return response
    log.info("%s %s: closing the WebSocket after %s", request.method, request.path, error)
    await response.close(code=close_code(error), message=close_reason(error))
    return response


class JsonRequestHandler(web.RequestHandler):
    """aiohttp's request handler, answering the requests it refuses before routing (bad
    HTTP, oversized lines and headers) with segtxn's JSON error, logged without a traceback."""

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:  # as aiohttp: too late for another answer
            raise ConnectionError("a response was already sent; cannot send an error")
        if status >= 500:
            ident = incident(f"{request.method} {request.path} failed", exc or Exception(message))
            error = ServerError(ErrorName.UNKNOWN, f"internal error, incident {ident}")
        elif isinstance(exc, ContentEncodingError):
            log.info("refused a request from %s: %s", request.remote, _cut(str(exc)))
            error = inputs.UnsupportedEncoding(inputs.refused_encoding(exc))
            status = inputs.UNSUPPORTED_ENCODING_STATUS
        else:
            too_large = isinstance(exc, LineTooLong) or "Too many headers" in str(exc)
            if too_large:
                status = 431
                text = (
                    f"a request line or header is over {MAX_LINE_BYTES} bytes, "
                    f"or there are over {MAX_HEADERS} headers"
                )
            else:
                text = f"malformed HTTP request: {message or exc}"
            log.info("refused a request from %s: %s", request.remote, _cut(str(exc or message)))
            error = ServerError(ErrorName.INVALID_ARGUMENT, text)
        response = error_response(error, status=status)
        response.force_close()
        return response


def server_span(scope: str, name: str) -> Callable[[Handler], Handler]:
    """A server span named ``name`` (of tracing scope ``scope``) around a handler, for a
    request that carries a trace context (``traceparent``: docs/tracing.md); current while
    it runs, so its log lines carry the trace id. The error a request was answered with is
    its ``segtxn.error``."""

    def wrap(handler: Handler) -> Handler:
        async def wrapped(request: web.Request) -> web.StreamResponse:
            span = tracing.server(scope, name, request.headers)
            if span is None:
                return await handler(request)
            with tracing.current(span):
                try:
                    response = await handler(request)
                except BaseException as e:
                    tracing.end(span, e)
                    raise
            span.set_attribute("http.response.status_code", response.status)
            error = response.headers.get("X-Segtxn-Error")
            if error is not None:
                span.set_attribute("segtxn.error", error)
            tracing.end(span)
            return response

        return wrapped

    return wrap
