"""Topic lookup: which broker serves a topic or segment, and a scalable topic's DAG.

``GET /lookup/v2/topic/...`` answers once: the home broker of a ``persistent://`` topic or a
segment, or a scalable topic's segments each with its broker's URL. ``/ws/v2/lookup/topic/...``
(a WebSocket) sends the DAG, then again after every change, until the client leaves (a
deleted topic closes it). ``GET /lookup/v2/coordinators`` lists the live v5 coordinators.

A version of a topic's record that does not decode (:class:`DamagedRecord`) is stored data
that is damaged, not a bug: the one-shot lookup answers ``PersistenceError`` naming its key;
the session sends an error frame saying the same and goes on (the client keeps the DAG it
has), sending the DAG again once a readable version is written. Ending the session instead
(1011, an incident) had every client following the topic reconnect in a loop, each meeting
it again and logging another traceback; the broker logs it at ERROR once, naming the key.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from aiohttp import WSCloseCode, web

from segtxn.aio import first_completed
from segtxn.auth import close_at_expiry
from segtxn.broker.http import (
    SERVICE,
    SOCKETS,
    error_response,
    json_errors,
    scalable_record,
    topic_from,
)
from segtxn.broker.service import BrokerService
from segtxn.ledger.errors import report_once
from segtxn.metastore import (
    Compacted,
    MetadataStore,
    Record,
    StoreAccessDenied,
    StoreUnavailable,
)
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.names import Domain, TopicName
from segtxn.topics.catalog import topic_key
from segtxn.topics.model import DamagedRecord, ScalableTopic, read_topic
from segtxn.topics.transactions import COORDINATOR_MEMBERS

log = logging.getLogger(__name__)

RETRY_MIN_S = 0.05
"""The first pause of a lookup session before asking a failing store again (it doubles, up
to the store's ``watch_retry_max_s``)."""


@json_errors
async def lookup(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE]
    name = topic_from(request)
    if name.domain is Domain.TOPIC:
        return web.json_response(await layout(service, name, await scalable_record(service, name)))
    home = await service.catalog.home_of(name)
    if home is None:
        if name.domain is Domain.PERSISTENT and service.settings.auto_create_topics:
            home = await service.catalog.create_persistent(name)
        else:
            raise ServerError(ErrorName.TOPIC_NOT_FOUND, f"topic {name} does not exist")
    url = await service.owner_url(name, home)
    if url is None:
        raise ServerError(ErrorName.SERVICE_NOT_READY, f"{name}'s broker {home!r} is down")
    return web.json_response({"topic": str(name), "brokerUrl": url})


async def layout(service: BrokerService, name: TopicName, topic: ScalableTopic) -> dict[str, Any]:
    """A scalable topic's DAG as clients see it: each segment with its broker's URL."""
    segments = []
    for s in topic.segments:
        home = await service.catalog.home_of(name.segment_name(s.id))
        url = await service.owner_url(name.segment_name(s.id), home) if home else None
        segments.append(
            {
                "id": s.id,
                "lo": s.lo,
                "hi": s.hi,
                "state": s.state,
                "parents": s.parents,
                "children": s.children,
                "brokerUrl": url,
            }
        )
    return {"topic": str(name), "epoch": topic.epoch, "segments": segments}


async def lookup_session(request: web.Request) -> web.StreamResponse:
    """``/ws/v2/lookup/topic/...``: the current DAG (a JSON text frame), then the DAG again
    after every change to it, until the client leaves. A deleted topic closes it."""
    service = request.app[SERVICE]
    try:
        name = topic_from(request)
        if name.domain is not Domain.TOPIC:
            raise ServerError(ErrorName.NOT_ALLOWED, f"{name}: lookup sessions are for topic://")
        record, revision = await _read(service.store, topic_key(name))
        if record is None:
            raise ServerError(ErrorName.TOPIC_NOT_FOUND, f"topic {name} does not exist")
    except ServerError as e:
        return error_response(e, request)
    retry_max_s = service.store.settings.watch_retry_max_s
    ws = web.WebSocketResponse(heartbeat=30)
    request.app[SOCKETS].add(ws)
    await ws.prepare(request)

    async def push() -> None:
        """Send the DAG of each new version of the record, from the one read above.

        The watch starts after the revision of the *read*, not after the record's own
        version: a topic left alone longer than the store keeps history has a version that
        is compacted away, and a watch from it would fail at once, every time. When the
        history the watch needs is compacted anyway (it was cut off for long), the record
        is read again and the DAG sent if it changed meanwhile.

        A store error (the store away, or refusing this broker: access may be given back)
        in that read, in the watch's opening or in a DAG's look-ups is tried again after a
        pause, as the watch itself does while it runs: it closed the session (1013 or
        1011), and every client following the topic reconnected at once, to brokers that
        could not answer it either while the store was away.
        """
        key = topic_key(name)
        current: Record | None = record
        start, sent = revision + 1, 0
        stale = False  # the history was compacted: read the record again
        failed = 0  # store errors in a row
        while True:
            try:
                if stale:
                    current, read_at = await _read(service.store, key)
                    start, stale = read_at + 1, False
                if current is None:
                    break
                if current.version != sent:  # new, or changed while the history was compacted
                    await send(current)
                    sent = current.version
                async with service.store.watch(key, from_revision=start) as events:
                    failed = 0
                    async for event in events:
                        current, start = event.record, event.revision + 1
                        if current is None:
                            break
                        await send(current)
                        sent = current.version
            except Compacted:
                stale = True
            except (StoreUnavailable, StoreAccessDenied) as e:
                failed += 1
                pause = min(RETRY_MIN_S * 2 ** min(failed - 1, 30), retry_max_s)
                log.log(
                    logging.WARNING if failed == 1 else logging.DEBUG,
                    "lookup session of %s: %s: %s; trying again (every %.1f s at most)",
                    name, type(e).__name__, e, retry_max_s,
                )  # fmt: skip
                await asyncio.sleep(pause)  # the store is away: pause, then try again
        await ws.close(code=WSCloseCode.GOING_AWAY, message=b"topic deleted")

    async def send(current: Record) -> None:
        """Send the DAG of ``current``, or, if it does not decode, an error frame."""
        try:
            topic = read_topic(current.key, current.value)
        except DamagedRecord as e:
            report_once(log, e, "lookup session of %s (version %d): %s", name, current.version, e)
            error = ErrorName.PERSISTENCE.value
            await ws.send_str(json.dumps({"topic": str(name), "error": error, "message": str(e)}))
            return
        if isinstance(topic, ScalableTopic):
            await ws.send_str(json.dumps(await layout(service, name, topic)))

    async def drain() -> None:
        async for _ in ws:  # the client says nothing; this ends when it leaves
            pass

    expiry = close_at_expiry(request, ws)
    try:
        await first_completed(push(), drain(), name=f"lookup-session-{name}")
    finally:
        expiry()
    await ws.close()
    return ws


async def _read(store: MetadataStore, key: str) -> tuple[Record | None, int]:
    """The record at ``key`` (None: absent) and the revision it was read at."""
    listing = await store.list_range(key, key + "\x01")  # keys hold no NUL: just ``key``
    return (listing.records[0] if listing.records else None), listing.revision


async def coordinators(request: web.Request) -> web.StreamResponse:
    """The URLs of the live v5 transaction coordinators."""
    listing = await request.app[SERVICE].store.list_prefix(COORDINATOR_MEMBERS)
    urls = sorted({record.value.decode() for record in listing.records})
    return web.json_response({"coordinators": urls})


def routes() -> list[web.RouteDef]:
    topic = "/{domain}/{tenant}/{namespace}/{topic}"  # the parser names a bad domain
    segment = "/{domain:segment}/{tenant}/{namespace}/{topic}/{segment:[0-9]+}"
    out: list[web.RouteDef] = [web.get("/lookup/v2/coordinators", coordinators)]
    for shape in (topic, segment):
        out += [
            web.get("/lookup/v2/topic" + shape, lookup),
            web.get("/ws/v2/lookup" + shape, lookup_session),
        ]
    return out
