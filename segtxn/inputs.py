"""What a request carries, read and checked at the edge, before a handler acts on it: its
query (each parameter at most once; only those its route declares with :func:`takes`,
checked after authentication: :func:`install_declared_check`) and its body (in a
``Content-Encoding`` aiohttp decodes: :func:`check_encoding`; all of it within
:data:`BODY_READ_TIMEOUT_S`; as JSON: well-formed, bounded in depth, valid Unicode, each key
once per object). Each check raises ServerError(InvalidArgument) with a message that says
what was wrong; the error boundary (:mod:`segtxn.boundary`) answers it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import hdrs, web
from aiohttp.compression_utils import HAS_BROTLI, HAS_ZSTD
from aiohttp.http_exceptions import ContentEncodingError

from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.limits import MAX_JSON_DEPTH

H = TypeVar("H", bound=Callable[..., Any])

_TAKES = "segtxn_query_parameters"
"""The attribute :func:`takes` puts on a handler."""


def takes(*names: str) -> Callable[[H], H]:
    """Declare the query parameters a route's handler takes (the decorator outermost: the
    handler the route is given carries the declaration). :func:`refuse_undeclared` refuses
    any other, and every parameter of a handler without a declaration: a handler reads its
    parameters itself, and one it does not read (``?segmnets=4``) would otherwise be
    ignored, and the request done as if it had not been given."""

    def declare(handler: H) -> H:
        setattr(handler, _TAKES, tuple(sorted(names)))
        return handler

    return declare


def check_query(request: web.BaseRequest) -> None:
    """Raise ServerError(InvalidArgument) for a query parameter given more than once: no
    endpoint takes a list in its query, and a request that says two things at once
    (``?action=COMMIT&action=ABORT``, ``?to=earliest&to=latest``) is refused, not resolved
    by silently taking the first, before anything is done."""
    query = request.query
    if len(query) == len(set(query)):
        return
    repeated = next(key for key in query if len(query.getall(key)) > 1)
    shown = repeated if repeated.isascii() and repeated.isprintable() else repr(repeated)
    raise ServerError(
        ErrorName.INVALID_ARGUMENT,
        f"query parameter {shown[:80]} given {len(query.getall(repeated))} times; give it once",
    )


def check_declared(request: web.Request) -> None:
    """Raise ServerError(InvalidArgument) for a query parameter the request's route does not
    take (:func:`takes`); the message names it and those the route takes. A request that
    matched no route is left to its 404 or 405."""
    query = request.query
    if not query:
        return
    match = request.match_info
    if not isinstance(match, web.UrlMappingMatchInfo) or match.http_exception is not None:
        return
    taken: tuple[str, ...] = getattr(match.handler, _TAKES, ())
    unknown = next((key for key in query if key not in taken), None)
    if unknown is None:
        return
    raise ServerError(
        ErrorName.INVALID_ARGUMENT,
        f"unknown parameter {unknown[:80]!r}: {request.method} {request.path} takes "
        f"{', '.join(taken) if taken else 'no query parameters'}",
    )


@web.middleware
async def refuse_undeclared(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """:func:`check_declared`, then the handler. Install it with
    :func:`install_declared_check`."""
    check_declared(request)
    return await handler(request)


def install_declared_check(app: web.Application) -> None:
    """Put :func:`refuse_undeclared` on ``app`` as its innermost middleware: call it after
    the error boundary (:func:`segtxn.boundary.install`, which answers its refusal) and
    after authentication (:func:`segtxn.auth.install_auth`). A request refused for its
    credentials (401, 403) then gets the same answer as without the check, and a caller
    that may not use an endpoint does not learn which parameters it takes."""
    app.middlewares.append(refuse_undeclared)


BODY_READ_TIMEOUT_S = 30.0
"""How long a request's body may take to arrive, all of it (a module constant: tests patch
it). The largest body a REST endpoint takes is :data:`~segtxn.protocol.limits.MAX_REQUEST_BYTES`,
well within this on any link a client uses; a body shorter than its ``Content-Length`` (a
client that stopped sending, or counted wrong) would otherwise hold its connection and the
handler waiting for ever."""


class BodyNotArrived(ServerError):
    """The body did not arrive in :data:`BODY_READ_TIMEOUT_S`: InvalidArgument (the client's
    mistake, and sending it again as it was fails again, so not ServiceNotReady). Its answer
    closes the connection (:func:`segtxn.boundary.error_response`): what the client sends
    after it cannot be told apart from the rest of the body."""

    def __init__(self, received: int, expected: int | None) -> None:
        of = "" if expected is None else f" of its {expected}"
        super().__init__(
            ErrorName.INVALID_ARGUMENT,
            f"the body did not arrive in {BODY_READ_TIMEOUT_S:g} s "
            f"({received}{of} bytes came); send all of it, as its Content-Length says",
        )


DECODED_ENCODINGS = frozenset(
    {"gzip", "deflate"} | ({"br"} if HAS_BROTLI else set()) | ({"zstd"} if HAS_ZSTD else set())
)
"""The ``Content-Encoding`` values aiohttp's parser decodes a request body from (as it
spells them, lower case; ``br`` and ``zstd`` only with their packages installed). It reads
a body of any other encoding as the bytes that came: they would be taken for the body."""
X_GZIP = "x-gzip"
"""gzip's old name, which RFC 9110 (8.4.1.3) says a recipient SHOULD take for ``gzip``.
aiohttp does not (both its parsers decode only the names above, and read an ``x-gzip``
body as the bytes that came), so it is refused as any other, its answer saying to send
the same body as ``gzip``."""
UNSUPPORTED_ENCODING_STATUS = 415
"""HTTP's Unsupported Media Type, the status of :class:`UnsupportedEncoding`."""


class UnsupportedEncoding(ServerError):
    """A body in a ``Content-Encoding`` the server does not decode: InvalidArgument, answered
    415 (:func:`segtxn.boundary.error_response`), before anything is read or done.

    Where aiohttp's parser would decode the body all the same (several ``Content-Encoding``
    lines, one of them an encoding it decodes: ``compress`` then ``gzip``), the body is
    marked read (:func:`check_encoding`) and the answer closes the connection
    (:attr:`closes`): aiohttp would otherwise read the rest of it after the answer, decode
    it as its parser chose, fail to decompress it and log "Unhandled exception" with a
    traceback; and its parser does not go on past a body it failed to decode. Any other
    body is left for aiohttp to read past after the answer, as the bytes that came (nothing
    decoded, nothing logged), and the connection stays open: closing it while a client is
    still sending a large body resets it before it reads the answer (``http.client``,
    ``requests`` and ``urllib`` send the whole body first)."""

    def __init__(self, encoding: str, *, closes: bool = False) -> None:
        self.closes = closes
        """The body was marked read: the answer must close the connection."""
        decoded = ", ".join(sorted(DECODED_ENCODINGS - {"gzip", "deflate"}))
        also = f", {decoded}" if decoded else ""
        instead = f"send the body as it is, or in gzip{also} or deflate"
        if encoding.lower() == X_GZIP:
            instead = f"{X_GZIP} is gzip's old name; send the same body with Content-Encoding: gzip"
        super().__init__(
            ErrorName.INVALID_ARGUMENT,
            f"Content-Encoding {encoding[:80]!r} is not one this server decodes: {instead}",
        )


def unsupported_encoding(request: web.BaseRequest) -> str | None:
    """The request's ``Content-Encoding`` if it is one aiohttp does not decode (not absent,
    ``identity``, or one of :data:`DECODED_ENCODINGS`, compared as aiohttp compares them:
    ASCII, any case; a list of several is not decoded), else None.

    Several ``Content-Encoding`` lines are one list (RFC 9110), so not decoded either: read
    line by line, the parser (its C build) decodes by the last and ``headers.get`` gives the
    first, so ``gzip`` then ``compress`` would pass as ``gzip`` and be read as it came."""
    lines = request.headers.getall(hdrs.CONTENT_ENCODING, [])
    if not lines:
        return None
    encoding = ", ".join(lines)
    if not encoding.isascii():
        return encoding
    if encoding.lower() in DECODED_ENCODINGS | {"", "identity"}:
        return None
    return encoding


def refused_encoding(error: ContentEncodingError) -> str:
    """The encoding aiohttp's parser refused a body in before any handler ran: ``br`` or
    ``zstd`` without its package (its message says which, as ``(br)``: the request it hands
    the error handler has no headers). A body that does not decompress fails later, as it
    is read, as a :class:`~aiohttp.web.RequestPayloadError`."""
    return next((e for e in ("br", "zstd") if f"({e})" in str(error)), "?")


def check_encoding(request: web.BaseRequest) -> None:
    """Raise :class:`UnsupportedEncoding` for a body aiohttp will not decode
    (:func:`unsupported_encoding`): read as it came, it would be taken for the body itself
    (stored as the raw bytes, or refused as "not JSON", which misleads). The body is first
    marked read where aiohttp would decode it all the same; its answer must then close the
    connection (:class:`UnsupportedEncoding`, ``closes``)."""
    encoding = unsupported_encoding(request)
    if encoding is None:
        return
    lines = request.headers.getall(hdrs.CONTENT_ENCODING, [])
    decoded = any(line.strip().lower() in DECODED_ENCODINGS for line in lines)
    if decoded:
        request.content.feed_eof()
    raise UnsupportedEncoding(encoding, closes=decoded)


async def read_body(request: web.BaseRequest) -> bytes:
    """The whole request body, read within :data:`BODY_READ_TIMEOUT_S`.

    Raises:
        UnsupportedEncoding: in a ``Content-Encoding`` not decoded (nothing is read).
        BodyNotArrived: it did not arrive in time; the body is marked read (aiohttp would
            otherwise wait for the rest of it after the answer).
        web.HTTPRequestEntityTooLarge: over the application's ``client_max_size``.
    """
    check_encoding(request)
    try:
        async with asyncio.timeout(BODY_READ_TIMEOUT_S):
            return await request.read()
    except TimeoutError:
        received = request.content.total_bytes
        request.content.feed_eof()
        raise BodyNotArrived(received, request.content_length) from None


async def read_json(request: web.Request) -> Any:
    """The request body as JSON: at most :data:`MAX_JSON_DEPTH` deep, valid Unicode, no
    key twice in one object.

    Raises:
        ServerError(InvalidArgument): not JSON (or a number of over 4300 digits, which
            Python does not read), nested too deep, a string with a lone
            surrogate (``"\\ud800"`` is valid JSON but no text: files and keys cannot hold it),
            or an object naming a key twice (``{"a": "1", "a": "2"}`` says two things; which
            one a parser keeps is not the client's to rely on).
        BodyNotArrived: the body did not arrive in :data:`BODY_READ_TIMEOUT_S`.
        web.HTTPRequestEntityTooLarge: over the application's ``client_max_size``.
    """
    body = await read_body(request)
    try:
        value = json.loads(body, object_pairs_hook=_object)
    except RecursionError:
        raise ServerError(
            ErrorName.INVALID_ARGUMENT, f"the body nests deeper than {MAX_JSON_DEPTH} levels"
        ) from None
    except ValueError as e:  # also a number of over 4300 digits: not a JSONDecodeError
        raise ServerError(ErrorName.INVALID_ARGUMENT, f"the body is not JSON: {e}") from e
    check_json(value)
    return value


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """One JSON object of a body, refused if it names a key twice."""
    value: dict[str, Any] = {}
    for key, item in pairs:
        if key in value:
            raise ServerError(
                ErrorName.INVALID_ARGUMENT, f"the body names {key[:80]!r} twice in one object"
            )
        value[key] = item
    return value


def check_json(value: Any) -> None:
    """Raise ServerError(InvalidArgument) for nesting deeper than :data:`MAX_JSON_DEPTH` or
    a string that is not valid Unicode (iterative: the depth is what is being checked)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise ServerError(
                    ErrorName.INVALID_ARGUMENT,
                    f"{item[:40]!r} is not valid Unicode (a lone surrogate)",
                ) from None
        elif isinstance(item, list | dict):
            if depth >= MAX_JSON_DEPTH:
                raise ServerError(
                    ErrorName.INVALID_ARGUMENT,
                    f"the body nests deeper than {MAX_JSON_DEPTH} levels",
                )
            items = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in items)
