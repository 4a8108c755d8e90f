"""Shared pieces of the broker's HTTP surface: app keys, names from paths, the error body
(:func:`segtxn.boundary.error_response`)."""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable

from aiohttp import web

from segtxn.boundary import error_response
from segtxn.broker.service import BrokerService
from segtxn.failures import translate
from segtxn.metastore import MetadataStoreError
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.names import InvalidTopicName, TopicName, client_name_problem
from segtxn.topics.model import ScalableTopic

__all__ = [
    "SERVICE",
    "SOCKETS",
    "check_name",
    "error_response",
    "json_errors",
    "scalable_record",
    "topic_from",
]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

SERVICE = web.AppKey("service", BrokerService)
SOCKETS = web.AppKey("sockets", weakref.WeakSet[web.WebSocketResponse])
"""Open WebSockets: closed on shutdown, or aiohttp waits for their handlers."""


def check_name(kind: str, value: str) -> str:
    """A producer, consumer or subscription name, or ServerError(InvalidArgument)."""
    problem = client_name_problem(kind, value)
    if problem is not None:
        raise ServerError(ErrorName.INVALID_ARGUMENT, problem)
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
        except MetadataStoreError as e:  # (an expired session is ServiceNotReady: it comes back)
            return error_response(translate(e) or ServerError(ErrorName.METADATA, str(e)), request)

    return wrapped


async def scalable_record(service: BrokerService, name: TopicName) -> ScalableTopic:
    """The record of scalable topic ``name``, or ServerError(TopicNotFound)."""
    record = await service.catalog.get(name)
    if not isinstance(record, ScalableTopic):
        raise ServerError(ErrorName.TOPIC_NOT_FOUND, f"topic {name} does not exist")
    return record
