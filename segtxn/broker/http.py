"""Shared pieces of the broker's HTTP surface: app keys and the error body."""

from __future__ import annotations

import json
import weakref
from urllib.parse import quote

from aiohttp import web

from segtxn.broker.service import BrokerService
from segtxn.protocol.errors import ErrorName, ServerError

SERVICE = web.AppKey("service", BrokerService)
SOCKETS = web.AppKey("sockets", weakref.WeakSet[web.WebSocketResponse])
"""Open WebSockets: closed on shutdown, or aiohttp waits for their handlers."""


def error_body(name: ErrorName | str, message: str) -> str:
    return json.dumps({"error": str(name), "message": message})


def error_response(error: ServerError, request: web.Request | None = None) -> web.Response:
    """``{"error": NAME, "message": ...}`` with the name's HTTP status; ``NotOwner`` is a
    307 whose ``Location`` is the same path and query on the serving broker."""
    # also in headers: a failed WebSocket handshake shows the client headers, not the body
    headers = {"X-Segtxn-Error": error.name.value, "X-Segtxn-Message": quote(error.message)}
    if error.name is ErrorName.NOT_OWNER and error.redirect and request is not None:
        headers["Location"] = error.redirect.rstrip("/") + request.path_qs
    return web.Response(
        status=error.name.http_status,
        text=error_body(error.name, error.message),
        content_type="application/json",
        headers=headers,
    )
