"""Shared pieces of the broker's HTTP surface: app keys, names from paths, the error body."""

from __future__ import annotations

import json
import re
import weakref
from urllib.parse import quote

from aiohttp import web

from segtxn.broker.service import BrokerService
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.names import InvalidTopicName, TopicName

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


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:=-]{0,127}$")


def check_name(kind: str, value: str) -> str:
    """A producer, consumer or subscription name, or ServerError(InvalidArgument)."""
    if not _NAME.match(value):
        raise ServerError(
            ErrorName.INVALID_ARGUMENT,
            f"{kind} name {value!r} must be 1-128 of letters, digits and _.:=- "
            "(starting with a letter or digit)",
        )
    return value


def topic_from(request: web.Request) -> TopicName:
    """The topic named by a route's ``domain/tenant/namespace/topic[/segment]`` parts."""
    info = request.match_info
    text = f"{info['domain']}://{info['tenant']}/{info['namespace']}/{info['topic']}"
    if "segment" in info:
        text += f"/{info['segment']}"
    try:
        return TopicName.parse(text)
    except InvalidTopicName as e:
        raise ServerError(ErrorName.INVALID_TOPIC_NAME, str(e)) from e
