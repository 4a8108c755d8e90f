"""Running an aiohttp application on a host and port: shared by brokers and coordinators."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import ssl
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import urlsplit

import aiohttp
from aiohttp import hdrs, web
from aiohttp.abc import AbstractAccessLogger

from segtxn.auth import TlsSettings
from segtxn.boundary import (
    HANDLER_ARGS,
    JsonRequestHandler,
    ServerHandler,
    answering_refusals,
    error_response,
    header_text,
)
from segtxn.connlimits import PROBE_PATHS, ConnectionGate, ConnectionLimits
from segtxn.exposition import Metrics
from segtxn.inputs import read_body
from segtxn.protocol.errors import ServerError


async def relay(
    session: aiohttp.ClientSession, request: web.Request, base_url: str
) -> web.Response:
    """Send ``request`` (method, path, query, body) on to the server at ``base_url`` and
    answer with its response, segtxn's ``X-Segtxn-*`` headers included. The caller's
    ``Authorization`` goes along: the server there checks the caller, not this server (whose
    session would otherwise present the cluster role's token).

    Raises aiohttp.ClientError / TimeoutError when that server cannot be reached;
    :class:`~segtxn.inputs.BodyNotArrived` when the request's body does not arrive in time."""
    body = await read_body(request)
    headers = {"Content-Type": request.content_type} if body else {}
    if hdrs.AUTHORIZATION in request.headers:
        headers[hdrs.AUTHORIZATION] = request.headers[hdrs.AUTHORIZATION]
    target = base_url.rstrip("/") + request.path_qs
    async with session.request(request.method, target, data=body, headers=headers) as answer:
        return web.Response(
            status=answer.status,
            body=await answer.read(),
            content_type=answer.content_type,
            headers={k: v for k, v in answer.headers.items() if k.startswith("X-Segtxn")},
        )


ACCESS_LOGGER = "aiohttp.access"
"""The logger of the access lines (aiohttp's name for it)."""


class AccessLogger(AbstractAccessLogger):
    """One line per HTTP request, at INFO, when the server is asked for them
    (``--access-log``; off by default: a transaction's calls (NEW_TXN, ADD_*, END_TXN) and
    every admin and health poll would bury the lines an operator reads)."""

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        self.logger.info(
            "%s %s %s -> %d in %.1f ms",
            request.remote,
            request.method,
            request.path_qs,
            response.status,
            time * 1000,
        )


def _access_log(enabled: bool) -> logging.Logger | None:
    """What aiohttp is given as its access log: None turns the lines off."""
    return logging.getLogger(ACCESS_LOGGER) if enabled else None


PROBE_CONNECTION_S = 5.0
"""How long a connection admitted past the limit for probes alone stays open, whatever it
does: a probe asks at once and is answered in milliseconds, while a flood's idle connections
would otherwise hold the headroom for the whole idle timeout, and the probes with it."""
REFUSAL_LINGER_S = 1.0
"""How long a refused connection stays open after its answer, for the client to read it
(closed at once, the request it sent meanwhile unread, the client's system may discard the
answer and report a reset instead)."""


class GatedRequestHandler(JsonRequestHandler):
    """:class:`JsonRequestHandler` for one connection that ``gate`` admits or refuses: a
    refused one is answered with the refusal (:func:`refusal_bytes`) before its request is
    read, and closed; aiohttp never serves it."""

    def __init__(self, gate: ConnectionGate, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._gate = gate
        self._address: str | None = None
        self._cut: asyncio.TimerHandle | None = None
        """Closes a refused connection after its answer, or one in the probes' headroom."""
        self._admitted = False
        self.probes_only = False
        """Admitted past the gate's limit, for :data:`~segtxn.connlimits.PROBE_PATHS`
        alone (:func:`probes_only_past_the_limit`)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        self._address = peer[0] if isinstance(peer, tuple) and peer else None
        refusal, self.probes_only = self._gate.admit(self._address)
        loop = asyncio.get_running_loop()
        if refusal is None:
            self._admitted = True
            super().connection_made(transport)
            if self.probes_only:  # its slot is for a probe: soon given back
                self._cut = loop.call_later(PROBE_CONNECTION_S, self.force_close)
            return
        transport = cast(asyncio.Transport, transport)  # (uvloop's are not its subclasses)
        transport.write(refusal_bytes(refusal))
        if transport.can_write_eof():
            transport.write_eof()  # (what it sent meanwhile is read and dropped)
        self._cut = loop.call_later(REFUSAL_LINGER_S, transport.abort)

    def data_received(self, data: bytes) -> None:
        if self._admitted:
            super().data_received(data)

    def eof_received(self) -> None:
        if self._admitted:
            super().eof_received()
        # a refused one: returning None closes it (its answer was written before)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._cut is not None:
            self._cut.cancel()
        if self._admitted:
            self._admitted = False
            self._gate.release(self._address)
            super().connection_lost(exc)


def probes_only_past_the_limit(handler: ServerHandler, gate: ConnectionGate) -> ServerHandler:
    """An application's request handler that answers a request on a connection admitted
    past ``gate``'s limit (:attr:`GatedRequestHandler.probes_only`) with the gate's refusal
    and closes it, unless it asks for a health check or metrics (:data:`PROBE_PATHS`)."""

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        if getattr(request.protocol, "probes_only", False) and request.path not in PROBE_PATHS:
            response = error_response(gate.full(), request)
            response.force_close()
            return response
        return await handler(request)

    return handle


def refusal_bytes(refusal: ServerError) -> bytes:
    """A whole HTTP/1.1 response refusing a connection: segtxn's JSON error, in headers too
    (a WebSocket client reads only those), ``Retry-After``, ``Connection: close``."""
    body = json.dumps({"error": refusal.name.value, "message": refusal.message}).encode()
    status = refusal.name.http_status
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n"
        "Retry-After: 1\r\n"
        f"X-Segtxn-Error: {refusal.name.value}\r\n"
        f"X-Segtxn-Message: {header_text(refusal.message)}\r\n\r\n"
    )
    return head.encode("ascii") + body


class _Site(web.BaseSite):
    """A TCP site whose connections are served by :class:`JsonRequestHandler`, so requests
    refused before routing get the JSON error too (aiohttp's TCPSite hard-wires its own
    handler class), as do those the router refuses before the middlewares
    (:func:`~segtxn.boundary.answering_refusals`)."""

    def __init__(
        self,
        runner: web.AppRunner,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        access_log: bool,
        *,
        listener: Listener | None,
        gate: ConnectionGate,
    ) -> None:
        super().__init__(runner)
        self._host = host
        self._port = port
        self._ssl = ssl_context
        self._access_log = access_log
        self._listener = listener
        self._gate = gate

    @property
    def name(self) -> str:
        return f"{'https' if self._ssl else 'http'}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        if server is None:  # BaseSite already refuses a runner that is not set up
            raise RuntimeError("the runner is not set up")
        loop = asyncio.get_running_loop()
        server.request_handler = probes_only_past_the_limit(
            answering_refusals(server.request_handler), self._gate
        )

        def handler() -> JsonRequestHandler:
            return GatedRequestHandler(
                self._gate,
                server,
                loop=loop,
                access_log_class=AccessLogger,
                access_log=_access_log(self._access_log),
                keepalive_timeout=self._gate.limits.idle_timeout_s,
                **HANDLER_ARGS,
            )

        if self._listener is not None:
            self._server = await loop.create_server(
                handler, sock=self._listener.socket, ssl=self._ssl
            )
        else:
            self._server = await loop.create_server(
                handler, self._host, self._port, reuse_address=True, ssl=self._ssl
            )


HANDLER_GRACE_S = 5.0
"""On stop, how long requests still being handled may take to finish (aiohttp's default is
a minute; WebSockets are closed before this wait)."""


class ListenFailed(OSError):
    """The server could not listen on its host and port (taken, not an address of this
    machine, not allowed). ``reason`` says why in words (``address already in use``)."""

    def __init__(self, host: str, port: int, error: OSError) -> None:
        code = error.errno
        reason = os.strerror(code) if isinstance(code, int) and code > 0 else error.strerror
        self.reason = (reason or str(error)).lower()
        super().__init__(error.errno, f"cannot listen on {host}:{port}: {self.reason}")
        self.host = host
        self.port = port

    def __str__(self) -> str:
        return str(self.strerror)


LISTEN_BACKLOG = 128
"""Connections the system queues for a :class:`Listener` until its server accepts them."""


class Listener:
    """A TCP socket listening on ``host:port`` from the moment it is made, for an
    :class:`AppServer` to serve on (``listener=``); the server closes it when it stops.

    Port 0 asks the system for a free port, and :attr:`port` says which it gave. The socket
    holds it from then on, so the URL a server advertises (and registers in the metadata
    store) can name the port before the server is built, and nothing can take the port
    before the server serves on it. (A port picked by binding a socket and closing it again
    is free only until another process binds it: the server could then not start.) A host
    name of several addresses is listened on at the first the system gives for it.

    Raises:
        ListenFailed: the port is taken, or the host is not an address of this machine.
    """

    def __init__(self, host: str, port: int = 0) -> None:
        self.host = host
        try:
            family, kind, proto, _, address = socket.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0]
            self.socket = socket.socket(family, kind, proto)
        except OSError as e:
            raise ListenFailed(host, port, e) from e
        try:
            # as asyncio's create_server sets them: a restart can listen again at once, and
            # an IPv6 address listens on IPv6 alone
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            self.socket.bind(address)
            self.socket.listen(LISTEN_BACKLOG)
        except OSError as e:
            self.socket.close()
            raise ListenFailed(host, port, e) from e
        self.port = int(self.socket.getsockname()[1])

    def close(self) -> None:
        """Stop listening (again: nothing happens)."""
        self.socket.close()

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class AppServer:
    """``start()`` serves ``app`` on ``host:port`` (defaults: the advertised URL's), or on
    ``listener`` (then its host and port); ``stop()`` runs its shutdown and clean-up (also
    after a failed or interrupted start) and closes the listener. With ``tls`` (a
    certificate and key), it serves HTTPS only, and reloads the files when they change while
    it runs (:class:`~segtxn.auth.ServerCertificate`). ``access_log``: a line per HTTP
    request (:class:`AccessLogger`). ``connections``: how many connections it holds, and
    for how long (:mod:`segtxn.connlimits`), shown on ``metrics``.

    The advertised URL names a port other than 0: a port the system picks is known only
    once bound, so a server on one is given the :class:`Listener` that holds it, and
    advertises that listener's port.

    Raises:
        AuthConfigError: the TLS files cannot be loaded.
        ValueError: ``advertise_url`` names port 0.
    """

    def __init__(
        self,
        app: web.Application,
        advertise_url: str,
        host: str | None,
        port: int | None,
        tls: TlsSettings | None = None,
        *,
        access_log: bool = False,
        listener: Listener | None = None,
        connections: ConnectionLimits | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        parts = urlsplit(advertise_url)
        if parts.port == 0:
            raise ValueError(
                f"advertised URL {advertise_url}: port 0 is no port a client can reach; "
                "listen on a Listener and advertise its port"
            )
        self.app = app
        self.listener = listener
        if listener is not None:
            self.host, self.port = listener.host, listener.port
        else:
            self.host = host or parts.hostname or "127.0.0.1"
            self.port = port if port is not None else (parts.port or 80)
        self.certificate = None if tls is None else tls.server_certificate()
        if self.certificate is not None:
            app.cleanup_ctx.append(self.certificate.reloading)
        self.access_log = access_log
        self.connections = connections or ConnectionLimits()
        self.gate = ConnectionGate(self.connections, advertise_url)
        if metrics is not None:
            self.gate.register(metrics)
        self._runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log_class=AccessLogger,
            access_log=_access_log(access_log),
            shutdown_timeout=HANDLER_GRACE_S,
        )

    async def start(self) -> None:
        """Start the app (its ``cleanup_ctx``), then listen.

        Raises:
            ListenFailed: the port is taken or the host is not an address of this machine.
        """
        await self._runner.setup()
        try:
            context = None if self.certificate is None else self.certificate.context
            site = _Site(
                self._runner,
                self.host,
                self.port,
                context,
                self.access_log,
                listener=self.listener,
                gate=self.gate,
            )
            await site.start()
        except OSError as e:
            raise ListenFailed(self.host, self.port, e) from e

    async def stop(self) -> None:
        try:
            await self._runner.cleanup()
        finally:
            if self.listener is not None:
                self.listener.close()
