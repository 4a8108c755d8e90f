"""Replicas over HTTP: the routes a storage node serves, and the client a writer uses.

Every call is ``POST /replica/v1/<op>?instance=&ledger=&id=...`` (``create``, ``append``
with ``first`` and ``recovery``, ``fence``, ``stat``, ``read`` with ``first`` and ``last``,
``delete``, ``discard`` with ``claim``). Entries travel as frames: a big-endian ``u32``
length, then the payload, one after another. Answers are JSON (``{"count": n}``,
``{"count": 0, "claim": c}`` for a create, ``{"count": n, "size": b}`` for a fence or a
stat, ``{"discarded": true|false}``), the
frames of a read, or ``{"error": kind, "message": text}`` with

| kind | status | raised by the client as |
| --- | --- | --- |
| ``Fenced`` | 409 | ``ReplicaFenced`` |
| ``Gap`` (with ``count``) | 409 | ``ReplicaGap`` |
| ``WrongInstance`` | 410 | ``ReplicaUnavailable`` |
| ``Missing`` | 404 | ``LedgerMissing`` |
| ``Corrupted`` | 422 | ``LedgerCorrupted`` |
| ``Behind`` (a read past what it holds) | 416 | ``ReplicaBehind`` |
| ``DeleteFailed`` (its volume refused: permissions, an I/O error) | 500 | ``DeleteFailed`` |
| ``InvalidArgument`` | 400; 415 | ``LedgerError`` (a bug in the writer) |

(415: a body in a ``Content-Encoding`` the node does not decode; it closes the connection
where aiohttp would decode the body all the same, as a 400 for a body that did not all
arrive in :data:`segtxn.inputs.BODY_READ_TIMEOUT_S` does.)

A connection error, a timeout, or any other answer is ``ReplicaUnavailable``.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import web

from segtxn import inputs
from segtxn.inputs import (
    UNSUPPORTED_ENCODING_STATUS,
    BodyNotArrived,
    UnsupportedEncoding,
    check_encoding,
    takes,
)
from segtxn.ledger.errors import DeleteFailed, LedgerCorrupted, LedgerError, LedgerMissing
from segtxn.ledger.replicas.members import (
    NO_CLAIM,
    Member,
    ReplicaBehind,
    ReplicaUnavailable,
)
from segtxn.ledger.replicas.node import (
    INSTANCE_FILE,
    ReplicaFenced,
    ReplicaGap,
    ReplicaNode,
    WrongInstance,
)

log = logging.getLogger(__name__)

PREFIX = "/replica/v1/"
MAX_NAME = 1024
MAX_READ_ENTRIES = 10_000
FILE_NAME_BYTES = 255
"""NAME_MAX: the node keeps a ledger's replicas in a directory named by its quoted name."""
_LENGTH = struct.Struct(">I")


def encode_frames(payloads: Sequence[bytes]) -> bytes:
    return b"".join(_LENGTH.pack(len(p)) + p for p in payloads)


def decode_frames(data: bytes) -> list[bytes]:
    """Raises ValueError for bytes that are not whole frames."""
    out: list[bytes] = []
    view = memoryview(data)
    offset = 0
    while offset < len(view):
        if offset + _LENGTH.size > len(view):
            raise ValueError(f"a frame header is cut at byte {offset}")
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += _LENGTH.size
        if offset + length > len(view):
            raise ValueError(f"a frame of {length} bytes is cut at byte {offset}")
        out.append(bytes(view[offset : offset + length]))
        offset += length
    return out


# --------------------------------------------------------------------- the server


class _BadRequest(Exception):
    pass


def _int(request: web.Request, key: str, lo: int) -> int:
    raw = request.query.get(key, "")
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18 or int(raw) < lo:  # (not "²")
        raise _BadRequest(f"{key} must be an integer >= {lo}, not {raw[:40]!r}")
    return int(raw)


def _flag(request: web.Request, key: str) -> bool:
    """``0`` (or absent) or ``1``: what :class:`HttpReplica` sends (kept so, not ``true``,
    so that brokers of different versions still read each other's requests)."""
    raw = request.query.get(key, "0")
    if raw not in ("0", "1"):
        raise _BadRequest(f"{key} must be 0 or 1, not {raw[:40]!r}")
    return raw == "1"


def _target(request: web.Request) -> tuple[str, int]:
    name = request.query.get("ledger", "")
    if not name or len(name) > MAX_NAME:
        raise _BadRequest(f"ledger must be a name of 1 to {MAX_NAME} characters")
    if name in (".", "..", INSTANCE_FILE):  # (quoted, they stay as they are: a directory
        # outside the ledgers, or the node's identity file)
        raise _BadRequest(f"ledger {name!r} is not a ledger name")
    if len(quote(name, safe="")) > FILE_NAME_BYTES:  # its replicas' directory name
        raise _BadRequest(f"ledger names a directory of over {FILE_NAME_BYTES} bytes")
    return name, _int(request, "id", 1)


async def _body(request: web.Request, limit: int) -> bytes:
    """The request body, read here rather than with ``request.read()``: a batch may be
    larger than the application's ``client_max_size`` (sized for REST bodies).

    All of it within :data:`segtxn.inputs.BODY_READ_TIMEOUT_S`, as a REST body: a peer that
    sends the head and then stalls (or counted its ``Content-Length`` wrong) would otherwise
    hold this handler and its connection for ever.

    Raises:
        _BadRequest: the body is over ``limit`` bytes.
        UnsupportedEncoding: in a ``Content-Encoding`` not decoded (nothing is read): its
            bytes would be taken for frames.
        BodyNotArrived: it did not arrive in time; the body is marked read (aiohttp would
            otherwise wait for the rest of it after the answer).
    """
    check_encoding(request)
    if request.content_length is not None and request.content_length > limit:
        raise _BadRequest(f"a body of {request.content_length} bytes is over {limit}")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(inputs.BODY_READ_TIMEOUT_S):
            async for chunk in request.content.iter_chunked(1 << 16):
                size += len(chunk)
                if size > limit:
                    raise _BadRequest(f"a body over {limit} bytes")
                chunks.append(chunk)
    except TimeoutError:
        request.content.feed_eof()
        raise BodyNotArrived(size, request.content_length) from None
    return b"".join(chunks)


def _error(kind: str, status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": kind, "message": message, **extra}, status=status)


def replica_routes(node: ReplicaNode) -> list[web.RouteDef]:
    """The routes of ``node``'s replica service, to add to a broker's application."""

    def handler(
        op: Callable[[web.Request, str, int], Awaitable[web.StreamResponse]],
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                node.check(request.query.get("instance", ""))
                name, ledger_id = _target(request)
                return await op(request, name, ledger_id)
            except _BadRequest as e:
                return _error("InvalidArgument", 400, str(e))
            except UnsupportedEncoding as e:
                response = _error("InvalidArgument", UNSUPPORTED_ENCODING_STATUS, e.message)
                if e.closes:  # the body was marked read: what follows is not told from it
                    response.force_close()
                return response
            except BodyNotArrived as e:  # closed: what follows is not told from the body
                log.info("replica %s: %s", request.path, e.message)
                response = _error("InvalidArgument", 400, e.message)
                response.force_close()
                return response
            except WrongInstance as e:
                return _error("WrongInstance", 410, str(e))
            except ReplicaFenced as e:
                return _error("Fenced", 409, str(e))
            except ReplicaGap as e:
                return _error("Gap", 409, str(e), count=e.count)
            except LedgerMissing as e:
                return _error("Missing", 404, str(e))
            except LedgerCorrupted as e:
                log.error("replica %s: %s", request.query.get("ledger", "")[:200], e)
                return _error("Corrupted", 422, str(e))
            except IndexError as e:
                return _error("Behind", 416, str(e))
            except DeleteFailed as e:  # (its writer says it: why, not an HTTP status)
                return _error("DeleteFailed", 500, str(e))

        return handle

    async def create(request: web.Request, name: str, ledger_id: int) -> web.StreamResponse:
        claim = await node.run(node.create, name, ledger_id)
        return web.json_response({"count": 0, "claim": claim})

    async def append(request: web.Request, name: str, ledger_id: int) -> web.StreamResponse:
        first = _int(request, "first", 0)
        recovery = _flag(request, "recovery")
        try:
            payloads = decode_frames(await _body(request, node.max_request_bytes))
        except ValueError as e:
            raise _BadRequest(str(e)) from None
        count = await node.run(node.append, name, ledger_id, first, payloads, recovery)
        return web.json_response({"count": count})

    async def fence(request: web.Request, name: str, ledger_id: int) -> web.StreamResponse:
        count, size = await node.run(node.fence, name, ledger_id)
        return web.json_response({"count": count, "size": size})

    async def stat(request: web.Request, name: str, ledger_id: int) -> web.StreamResponse:
        count, size = await node.run(node.stat, name, ledger_id)
        return web.json_response({"count": count, "size": size})

    async def read(request: web.Request, name: str, ledger_id: int) -> web.StreamResponse:
        first = _int(request, "first", 0)
        last = _int(request, "last", first)
        if last - first >= MAX_READ_ENTRIES:
            raise _BadRequest(f"at most {MAX_READ_ENTRIES} entries per read")
        payloads = await node.run(node.read, name, ledger_id, first, last)
        return web.Response(body=encode_frames(payloads))

    async def delete(request: web.Request, name: str, ledger_id: int) -> web.StreamResponse:
        await node.run(node.delete, name, ledger_id)
        return web.json_response({})

    async def discard(request: web.Request, name: str, ledger_id: int) -> web.StreamResponse:
        discarded = await node.run(node.discard, name, ledger_id, _int(request, "claim", 1))
        return web.json_response({"discarded": discarded})

    ops = {
        "create": create,
        "append": append,
        "fence": fence,
        "stat": stat,
        "read": read,
        "delete": delete,
        "discard": discard,
    }
    routed = ("instance", "ledger", "id")  # every call's (HttpReplica._call)
    extra = {"append": ("first", "recovery"), "read": ("first", "last"), "discard": ("claim",)}
    return [
        web.post(PREFIX + op, takes(*routed, *extra.get(op, ()))(handler(call)))
        for op, call in ops.items()
    ]


# --------------------------------------------------------------------- the client


Locate = Callable[[str], Awaitable[str | None]]
"""A broker id's advertised URL now (None: it is not registered): looked up per call, as a
restarted broker may come back at another address."""


class HttpReplica:
    """The replicas of ``member``, reached at its broker's URL (``locate``)."""

    def __init__(
        self,
        member: Member,
        locate: Locate,
        session: aiohttp.ClientSession,
        *,
        timeout_s: float,
    ) -> None:
        self.member = member
        self._locate = locate
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def create(self, name: str, ledger_id: int) -> int:
        answer = await self._call("create", name, ledger_id)
        claim = answer.get("claim") if isinstance(answer, dict) else None
        if isinstance(claim, int) and not isinstance(claim, bool) and claim > 0:
            return claim
        return NO_CLAIM  # (a node of an earlier version: created, and left to its sweep)

    async def append(
        self, name: str, ledger_id: int, first: int, payloads: Sequence[bytes], *, recovery: bool
    ) -> int:
        params = {"first": str(first), "recovery": "1" if recovery else "0"}
        answer = await self._call("append", name, ledger_id, params, encode_frames(payloads))
        return self._number(answer, "count", "append")

    async def fence(self, name: str, ledger_id: int) -> tuple[int, int]:
        answer = await self._call("fence", name, ledger_id)
        return self._number(answer, "count", "fence"), self._number(answer, "size", "fence")

    async def stat(self, name: str, ledger_id: int) -> tuple[int, int]:
        answer = await self._call("stat", name, ledger_id)
        return self._number(answer, "count", "stat"), self._number(answer, "size", "stat")

    def _number(self, answer: Any, key: str, op: str) -> int:
        """``answer[key]``, a count or size; ReplicaUnavailable for anything else (the
        wire's contract: an answer we do not know is an unavailable replica)."""
        value = answer.get(key) if isinstance(answer, dict) else None
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ReplicaUnavailable(f"{self.member}: its {op} answered {str(answer)[:200]!r}")
        return value

    async def read(self, name: str, ledger_id: int, first: int, last: int) -> list[bytes]:
        params = {"first": str(first), "last": str(last)}
        body = await self._call("read", name, ledger_id, params, raw=True)
        assert isinstance(body, bytes)
        try:
            payloads = decode_frames(body)
        except ValueError as e:
            raise ReplicaUnavailable(f"{self.member}: a read answered {e}") from None
        if not 1 <= len(payloads) <= last - first + 1:
            raise ReplicaUnavailable(
                f"{self.member}: a read of {last - first + 1} entries got {len(payloads)}"
            )
        return payloads

    async def delete(self, name: str, ledger_id: int) -> None:
        await self._call("delete", name, ledger_id)

    async def discard(self, name: str, ledger_id: int, claim: int) -> bool:
        answer = await self._call("discard", name, ledger_id, {"claim": str(claim)})
        discarded = answer.get("discarded") if isinstance(answer, dict) else None
        if not isinstance(discarded, bool):
            raise ReplicaUnavailable(f"{self.member}: its discard answered {str(answer)[:200]!r}")
        return discarded

    async def _call(
        self,
        op: str,
        name: str,
        ledger_id: int,
        params: dict[str, str] | None = None,
        body: bytes = b"",
        *,
        raw: bool = False,
    ) -> Any:
        query = {"instance": self.member.instance, "ledger": name, "id": str(ledger_id)}
        query.update(params or {})
        where = f"{self.member} ({op} of ledger {ledger_id} of {name})"
        try:
            url = await self._locate(self.member.broker)
        except ReplicaUnavailable:
            raise
        except Exception as e:  # a directory that failed: the replica cannot be reached
            raise ReplicaUnavailable(f"{where}: cannot tell where it is: {e}") from e
        if url is None:
            raise ReplicaUnavailable(f"{where}: broker {self.member.broker} is not registered")
        try:
            async with self._session.post(
                url.rstrip("/") + PREFIX + op, params=query, data=body, timeout=self._timeout
            ) as response:
                if response.status == 200:
                    if raw:
                        return await response.read()
                    try:
                        return await response.json()
                    except ValueError as e:  # (not JSON: a node that answers garbage)
                        raise ReplicaUnavailable(f"{where}: its answer is not JSON: {e}") from None
                try:
                    answer = await response.json()
                    kind, message = str(answer["error"]), str(answer["message"])
                except (ValueError, KeyError, TypeError, aiohttp.ContentTypeError):
                    kind, message = "", f"HTTP {response.status}"
                count = answer.get("count") if kind == "Gap" else None
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            raise ReplicaUnavailable(f"{where}: {type(e).__name__}: {e}") from None
        message = f"{where}: {message}"
        if kind == "Fenced":
            raise ReplicaFenced(message)
        if kind == "Gap" and isinstance(count, int):
            raise ReplicaGap(message, count=count)
        if kind == "Missing":
            raise LedgerMissing(message, paths=(str(self.member),))
        if kind == "Corrupted":
            raise LedgerCorrupted(message, path=str(self.member))
        if kind == "Behind":
            raise ReplicaBehind(message)
        if kind == "DeleteFailed":
            raise DeleteFailed(message)
        if kind == "InvalidArgument":
            raise LedgerError(message)
        raise ReplicaUnavailable(message)  # WrongInstance, or an answer we do not know
