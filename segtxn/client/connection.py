"""Reaching the right broker: lookup, redirects, and WebSocket connections with errors."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import unquote, urlencode

import aiohttp

from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.names import TopicName

MAX_REDIRECTS = 5
HANDSHAKE_S = 5.0
"""How long a WebSocket handshake the caller gave up on may take to finish, to be closed."""


def _error(status: int, headers: Any, body: str = "") -> ServerError:
    name = headers.get("X-Segtxn-Error") if headers else None
    message = unquote(headers.get("X-Segtxn-Message", "")) if headers else ""
    if not name and body:
        try:
            parsed = json.loads(body)
            name, message = parsed["error"], parsed["message"]
        except (ValueError, KeyError, TypeError):
            pass
    try:
        error_name = ErrorName(name) if name else ErrorName.UNKNOWN
    except ValueError:
        error_name = ErrorName.UNKNOWN
    redirect = headers.get("Location") if headers else None
    return ServerError(error_name, message or f"HTTP {status}", redirect=redirect)


class Connector:
    """HTTP and WebSocket access to a segtxn cluster through any of its brokers."""

    def __init__(
        self, service_url: str, session: aiohttp.ClientSession, request_timeout_s: float = 30.0
    ) -> None:
        self.service_url = service_url.rstrip("/")
        self.session = session
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s)

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """An admin/lookup call; returns the decoded JSON (None for an empty body).

        Raises:
            ServerError: the error the broker answered with.
        """
        url = path if path.startswith("http") else self.service_url + path
        kwargs.setdefault("timeout", self._timeout)
        try:
            async with self.session.request(method, url, **kwargs) as response:
                text = await response.text()
                if response.status >= 400:
                    raise _error(response.status, response.headers, text)
                return json.loads(text) if text else None
        except (aiohttp.ClientConnectionError, TimeoutError) as e:
            raise ServerError(ErrorName.SERVICE_NOT_READY, f"cannot reach {url}: {e!r}") from e

    async def lookup(self, topic: TopicName) -> Any:
        return await self.request("GET", f"/lookup/v2/topic/{topic.path}")

    async def broker_for(self, topic: TopicName) -> str:
        return str((await self.lookup(topic))["brokerUrl"])

    async def _ws_connect(self, url: str) -> aiohttp.ClientWebSocketResponse:
        """``ws_connect``, hanging up if the caller gives up half-way: the broker may already
        have accepted the upgrade, and would otherwise keep a session (a lookup session holds
        a store watch) for a client that is gone until its heartbeat notices, a minute later.
        """
        attempt = asyncio.ensure_future(self.session.ws_connect(url, max_msg_size=0, heartbeat=30))
        try:
            return await asyncio.shield(attempt)
        except asyncio.CancelledError:
            try:
                ws = await asyncio.wait_for(attempt, HANDSHAKE_S)
            except (aiohttp.ClientError, OSError, TimeoutError):
                raise asyncio.CancelledError from None  # it failed anyway: nothing to close
            await ws.close()
            raise

    async def websocket(
        self, broker_url: str, kind: str, topic: TopicName, suffix: str, query: dict[str, str]
    ) -> aiohttp.ClientWebSocketResponse:
        """Open ``/ws/v2/<kind>/<topic><suffix>`` on the broker, following NotOwner.

        Raises:
            ServerError: what the broker refused the connection with.
        """
        url = f"{broker_url.rstrip('/')}/ws/v2/{kind}/{topic.path}{suffix}"
        if query:
            url += "?" + urlencode(query)
        for _ in range(MAX_REDIRECTS):
            try:
                return await self._ws_connect(url)
            except aiohttp.WSServerHandshakeError as e:
                error = _error(e.status, e.headers)
                if error.name is ErrorName.NOT_OWNER and error.redirect:
                    url = error.redirect
                    continue
                raise error from e
            except aiohttp.ClientConnectionError as e:
                raise ServerError(
                    ErrorName.SERVICE_NOT_READY, f"cannot reach {broker_url}: {e}"
                ) from e
        raise ServerError(ErrorName.SERVICE_NOT_READY, f"too many redirects for {topic}")
