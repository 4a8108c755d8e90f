"""Reaching the right broker: lookup, redirects, and WebSocket connections with errors,
through one or several service URLs."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import unquote, urlencode, urlsplit

import aiohttp
import msgspec

from segtxn import tracing
from segtxn.client.errors import CertificateError, ClientClosed, Timeout
from segtxn.client.timeouts import CLOSE_WAIT_S, Deadline, Timeouts
from segtxn.client.unreachable import why_unreachable
from segtxn.protocol import frames
from segtxn.protocol.auth import ssl_reason
from segtxn.protocol.errors import (
    ErrorCategory,
    ErrorName,
    NotOwner,
    ServerError,
    ServiceNotReady,
    server_error,
)
from segtxn.protocol.names import TopicName

log = logging.getLogger(__name__)

MAX_REDIRECTS = 5
WS_TIMEOUT = aiohttp.ClientWSTimeout(ws_close=CLOSE_WAIT_S)
HANDSHAKE_S = 5.0
"""How long a WebSocket handshake the caller gave up on may take to finish, to be closed."""


def _error(status: int, headers: Any, body: str = "") -> ServerError:
    """The error a broker answered with (its name in a header, else in the JSON body), as
    the class named after it; UnknownError for a name this client does not know."""
    name = headers.get("X-Segtxn-Error") if headers else None
    message = unquote(headers.get("X-Segtxn-Message", "")) if headers else ""
    if not name and body:
        try:
            parsed = json.loads(body)
            name, message = parsed["error"], parsed["message"]
        except (ValueError, KeyError, TypeError):
            pass
    error_name = ErrorName.parse(name) if isinstance(name, str) else ErrorName.UNKNOWN
    redirect = headers.get("Location") if headers else None
    return server_error(error_name, message or f"HTTP {status}", redirect=redirect)


def tls_failure(url: str, e: aiohttp.ClientSSLError) -> CertificateError:
    """``e`` said in words: why the server's certificate did not verify, or the handshake
    failed."""
    if isinstance(e, aiohttp.ClientConnectorCertificateError):
        why = ssl_reason(e.certificate_error)
        return CertificateError(f"{url}: the server's TLS certificate does not verify: {why}")
    why = ssl_reason(e.os_error)
    if "WRONG_VERSION_NUMBER" in why:  # what OpenSSL makes of a plain-HTTP answer
        why = "the server does not speak TLS there (is it an http:// URL?)"
    return CertificateError(f"{url}: the TLS handshake failed: {why}")


async def server_frames(
    ws: aiohttp.ClientWebSocketResponse, where: str
) -> AsyncIterator[frames.ServerFrame]:
    """The broker's frames on ``ws`` until it closes, batches unpacked (each receipt or
    message of a ``ReceiptBatch``/``MessageBatch`` in turn). A message that is not a frame
    (text, or bytes that do not decode) is logged at WARNING with ``where`` and skipped: one
    bad frame must not end a connection whose other frames are good."""
    async for message in ws:
        if message.type is not aiohttp.WSMsgType.BINARY:
            continue
        try:
            frame = frames.server_frame.decode(message.data)
        except msgspec.DecodeError:
            log.warning("undecodable frame from the broker on %s", where)
            continue
        for each in frames.unbatch(frame):  # a batch's receipts or messages, one by one
            yield each


def service_urls(spec: str | Sequence[str]) -> list[str]:
    """The brokers a client may ask first: ``"http://b1:8080,http://b2:8080"`` or a list.

    Raises:
        ValueError: no URL, or one that is not http(s)://.
    """
    parts = spec.split(",") if isinstance(spec, str) else list(spec)
    urls = [part.strip().rstrip("/") for part in parts if part.strip()]
    if not urls:
        raise ValueError("no service URL")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"service URL {url!r} must be http(s)://host:port")
    return urls


class Connector:
    """HTTP and WebSocket access to a segtxn cluster through any of its brokers.

    ``service_url`` is one broker's URL, several separated by commas, or a list: calls go to
    the one that last answered, and move on to the next when it cannot be reached (a
    connection refused is tried on the next at once; a retried call's next attempt goes to
    the next). Lookups then lead to each topic's own broker.

    Args:
        request_timeout_s: the limit of a single call, as ``timeouts.operation_timeout_s``
            (kept for callers that build a Connector by hand).
        timeouts: the client's time limits (:class:`Timeouts`).
    """

    def __init__(
        self,
        service_url: str | Sequence[str],
        session: aiohttp.ClientSession,
        request_timeout_s: float | None = None,
        *,
        timeouts: Timeouts | None = None,
    ) -> None:
        self.service_urls = service_urls(service_url)
        self._preferred = 0
        self.session = session
        timeouts = timeouts or Timeouts()
        if request_timeout_s is not None:
            timeouts = replace(timeouts, operation_timeout_s=request_timeout_s)
        self.timeouts = timeouts

    @property
    def service_url(self) -> str:
        """The service URL calls go to first (the one that last answered)."""
        return self.service_urls[self._preferred]

    def unreachable(self, url: str) -> None:
        """``url`` (or a path on it) did not answer: prefer the next service URL."""
        if url.startswith(self.service_url):
            self._preferred = (self._preferred + 1) % len(self.service_urls)

    def _check_open(self) -> None:
        """Raises ClientClosed once the client's session is closed: a transaction, an
        admin handle or a stream kept past ``Client.close()`` gets the client's own error,
        not aiohttp's RuntimeError("Session is closed")."""
        if self.session.closed:
            raise ClientClosed("the client was closed")

    def _bases(self) -> list[str]:
        n = len(self.service_urls)
        return [self.service_urls[(self._preferred + i) % n] for i in range(n)]

    async def request(
        self, method: str, path: str, *, timeout_s: float | None = None, **kwargs: Any
    ) -> Any:
        """One admin/lookup/coordinator call; returns the decoded JSON (None for an empty
        body). A relative ``path`` goes to the service URLs, the next one tried while none
        accepts a connection (nothing was sent yet).

        Args:
            timeout_s: the limit of the whole call (default: ``operation_timeout_s``).

        Raises:
            ServerError: the error the broker answered with; ServiceNotReady when no
                service URL could be reached, or the connection broke.
            CertificateError: TLS failed (the server's certificate, or the handshake).
            Timeout: no answer in time (RETRIABLE for a GET, else OUTCOME_UNKNOWN: it may
                have been done).
            ClientClosed: the client was closed (nothing was sent).
        """
        self._check_open()
        deadline = Deadline(self.timeouts.limit(timeout_s))
        urls = [path] if path.startswith("http") else [base + path for base in self._bases()]
        failures: list[str] = []
        last: BaseException | None = None  # the transport error the ServiceNotReady is from
        for i, url in enumerate(urls):
            # a GET changes nothing: with more URLs to try, one that does not answer within
            # request_timeout_s is left for the next
            more = method == "GET" and i < len(urls) - 1
            attempt = Deadline(deadline.cap(self.timeouts.request_timeout_s if more else None))
            try:
                async with attempt.timeout():
                    return await self._once(method, url, attempt, **kwargs)
            except TimeoutError as e:  # a connect timeout too: aiohttp's are TimeoutErrors
                failures.append(f"{url}: no answer within {attempt}")
                last = e
                self.unreachable(url)
                connecting = isinstance(e, aiohttp.ConnectionTimeoutError)  # nothing was sent
                if deadline.expired() or not (more or connecting):
                    raise self._timeout(method, url, deadline) from e
            except aiohttp.ClientSSLError as e:  # another URL would not verify better
                raise tls_failure(url, e) from e
            except aiohttp.ClientConnectorError as e:  # refused: nothing sent, try the next
                failures.append(f"{url}: {why_unreachable(e)}")
                last = e
                self.unreachable(url)
            except aiohttp.ClientConnectionError as e:
                self.unreachable(url)
                raise ServiceNotReady(f"cannot reach {url}: {why_unreachable(e)}") from e
        raise ServiceNotReady("cannot reach " + "; ".join(failures)) from last

    async def _once(self, method: str, url: str, deadline: Deadline, **kwargs: Any) -> Any:
        kwargs.setdefault("timeout", aiohttp.ClientTimeout(total=deadline.remaining()))
        if tracing.enabled():  # the current span's trace context, as a W3C header
            headers = dict(kwargs.pop("headers", None) or {})
            tracing.inject(headers)
            kwargs["headers"] = headers
        async with self.session.request(method, url, **kwargs) as response:
            text = await response.text()
            if response.status >= 300:  # (a redirect followed is answered by its target;
                raise _error(response.status, response.headers, text)  # one not, is not)
            return json.loads(text) if text else None

    @staticmethod
    def _timeout(method: str, url: str, deadline: Deadline) -> Timeout:
        return Timeout(
            f"{method} {url}: no answer within {deadline}",
            category=ErrorCategory.RETRIABLE if method == "GET" else ErrorCategory.OUTCOME_UNKNOWN,
        )

    async def lookup(self, topic: TopicName, *, timeout_s: float | None = None) -> Any:
        return await self.request("GET", f"/lookup/v2/topic/{topic.path}", timeout_s=timeout_s)

    async def broker_for(self, topic: TopicName) -> str:
        return str((await self.lookup(topic))["brokerUrl"])

    async def _ws_connect(self, url: str) -> aiohttp.ClientWebSocketResponse:
        """``ws_connect``, hanging up if the caller gives up half-way: the broker may already
        have accepted the upgrade, and would otherwise keep a session (a lookup session holds
        a store watch) for a client that is gone until its heartbeat notices, a minute later.
        """
        attempt = asyncio.ensure_future(
            self.session.ws_connect(url, max_msg_size=0, heartbeat=30, timeout=WS_TIMEOUT)
        )
        try:
            return await asyncio.shield(attempt)
        except asyncio.CancelledError:
            try:
                async with asyncio.timeout(HANDSHAKE_S):
                    ws = await attempt
            except (aiohttp.ClientError, OSError, TimeoutError):
                raise asyncio.CancelledError from None  # it failed anyway: nothing to close
            await ws.close()
            raise

    async def websocket(
        self, broker_url: str, kind: str, topic: TopicName, suffix: str, query: dict[str, str]
    ) -> aiohttp.ClientWebSocketResponse:
        """Open ``/ws/v2/<kind>/<topic><suffix>`` on the broker, following NotOwner. No time
        limit of its own: callers bound it (:func:`segtxn.client.timeouts.retrying`).

        Raises:
            ServerError: what the broker refused the connection with; ServiceNotReady when
                it cannot be reached.
            CertificateError: TLS failed (the server's certificate, or the handshake).
            ClientClosed: the client was closed.
        """
        ws, _ = await self.websocket_at(broker_url, kind, topic, suffix, query)
        return ws

    async def websocket_at(
        self, broker_url: str, kind: str, topic: TopicName, suffix: str, query: dict[str, str]
    ) -> tuple[aiohttp.ClientWebSocketResponse, str]:
        """:meth:`websocket`, and the URL of the broker it is connected to: ``broker_url``,
        or the one a NotOwner redirect led to. A transaction's sends and acks are *placed*
        on it (the one-step commit, :mod:`segtxn.client.onestep`).

        Raises: as :meth:`websocket`.
        """
        self._check_open()
        base = broker_url.rstrip("/")
        url = f"{base}/ws/v2/{kind}/{topic.path}{suffix}"
        if query:
            url += "?" + urlencode(query)
        for _ in range(MAX_REDIRECTS):
            try:
                return await self._ws_connect(url), base
            except aiohttp.WSServerHandshakeError as e:
                error = _error(e.status, e.headers)
                if isinstance(error, NotOwner) and error.redirect:
                    url = error.redirect
                    parts = urlsplit(url)  # the same path and query on the serving broker
                    base = f"{parts.scheme}://{parts.netloc}"
                    continue
                raise error from e
            except aiohttp.ClientSSLError as e:
                raise tls_failure(url, e) from e
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
                self.unreachable(broker_url)
                raise ServiceNotReady(f"cannot reach {broker_url}: {why_unreachable(e)}") from e
        raise ServiceNotReady(f"too many redirects for {topic}")
