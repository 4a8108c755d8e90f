"""Shared pieces of the broker's HTTP surface: app keys, names from paths, the error body."""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Awaitable, Callable
from urllib.parse import quote

from aiohttp import web

from segtxn.broker.service import BrokerService
from segtxn.metastore import MetadataStoreError, StoreUnavailable
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.names import InvalidTopicName, TopicName
from segtxn.topics.model import ScalableTopic

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

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


def json_errors(handler: Handler) -> Handler:
    """A handler whose ServerErrors (and metadata store errors) become the JSON error body."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except ServerError as e:
            return error_response(e, request)
        except StoreUnavailable as e:
            error = ServerError(ErrorName.SERVICE_NOT_READY, f"metadata store: {e}")
            return error_response(error, request)
        except MetadataStoreError as e:
            return error_response(ServerError(ErrorName.METADATA, str(e)), request)

    return wrapped


async def scalable_record(service: BrokerService, name: TopicName) -> ScalableTopic:
    """The record of scalable topic ``name``, or ServerError(TopicNotFound)."""
    record = await service.catalog.get(name)
    if not isinstance(record, ScalableTopic):
        raise ServerError(ErrorName.TOPIC_NOT_FOUND, f"topic {name} does not exist")
    return record
