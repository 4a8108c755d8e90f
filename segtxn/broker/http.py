"""Shared pieces of the broker's HTTP surface: app keys, names from paths, the error body
(:func:`segtxn.boundary.error_response`)."""

from __future__ import annotations

import weakref

from aiohttp import web

from segtxn.boundary import error_response
from segtxn.broker.service import BrokerService
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.names import InvalidTopicName, TopicName, client_name_problem

__all__ = ["SERVICE", "SOCKETS", "check_name", "error_response", "topic_from"]

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
