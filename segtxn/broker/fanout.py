"""An admin call on a scalable topic, run on every segment's home broker.

A ``topic://`` has no data of its own: its stats, subscriptions, trims and deletion are the
same call on each of its segments (``segment://.../<id>``), made on the broker that holds
the segment, and their answers gathered by segment id. Split from :mod:`.admin` so that the
topic's deletion (:mod:`.deletion`) can use it too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp import web

from segtxn.broker.http import SERVICE, scalable_record
from segtxn.broker.service import BrokerService
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.names import TopicName
from segtxn.topics.model import ScalableTopic, SegmentState

HTTP = web.AppKey("http", aiohttp.ClientSession)
"""The broker's session for calls to other brokers (as the cluster role)."""


async def fan_out(
    request: web.Request,
    name: TopicName,
    method: str,
    suffix: str,
    body: Any = None,
    *,
    deleting: bool = False,
    record: ScalableTopic | None = None,
    params: Mapping[str, str] | None = None,
    only_creating: bool = False,
    settled_by: ErrorName | None = None,
) -> dict[str, Any]:
    """Run an admin call on every segment of scalable topic ``name``, on its home broker,
    and return each answer by segment id; the RETIRED ones (their data is gone,
    segtxn/broker/retire.py) only with ``deleting``, and so the children of a split or merge
    in progress (:meth:`ScalableTopic.creating`: their data may exist; one not placed yet
    has none, and is skipped). A segment that retires while this runs answers nothing
    (None).

    Args:
        suffix: the call's path after the segment's (``/stats``; ``""`` for the segment).
        record: the topic's record to take the segments from (default: read it now).
        params: the query to send (default: the request's own).
        only_creating: on the children of a split or merge in progress alone (those
            placed already).
        settled_by: a refusal that means the call is done there already (a subscription
            deleted by an earlier call that stopped part-way): that segment's answer is
            the error, and the call goes on with the next.

    Raises:
        ServerError: TopicNotFound (no such topic); ServiceNotReady (a segment's broker is
            down or did not answer); the first error a segment's broker answered with,
            its message prefixed with the segment's name.
    """
    service = request.app[SERVICE]
    if record is None:
        record = await scalable_record(service, name)
    query = request.query if params is None else params
    results: dict[str, Any] = {}
    ids = [s.id for s in record.segments if deleting or s.state is not SegmentState.RETIRED]
    creating = record.creating() if deleting or only_creating else []
    if only_creating:
        ids = []
    for segment_id in ids + creating:
        ledger = name.segment_name(segment_id)
        home = await service.catalog.home_of(ledger)
        if home is None and segment_id in creating:
            continue  # not placed yet: nothing of it on any broker
        url = await service.catalog.broker_url(home) if home else None
        if url is None:
            raise ServerError(ErrorName.SERVICE_NOT_READY, f"{ledger}'s broker is down")
        target = f"{url}/admin/v2/{ledger.path}{suffix}"
        try:
            async with request.app[HTTP].request(method, target, params=query, json=body) as r:
                text = await r.text()
                status = r.status
        except (aiohttp.ClientConnectionError, TimeoutError) as e:
            # its registration outlives a dead broker until its session expires
            raise ServerError(
                ErrorName.SERVICE_NOT_READY, f"{ledger}'s broker at {url} did not answer ({e})"
            ) from e
        if status >= 400:
            try:
                error = json.loads(text)
                failed = ServerError(ErrorName(error["error"]), f"{ledger}: {error['message']}")
            except (ValueError, KeyError, TypeError):
                raise ServerError(ErrorName.UNKNOWN, f"{ledger}: HTTP {status}") from None
            if failed.name is ErrorName.TOPIC_NOT_FOUND and await _gone(service, ledger):
                results[str(segment_id)] = None
                continue
            if failed.name is settled_by:
                results[str(segment_id)] = failed
                continue
            raise failed
        results[str(segment_id)] = json.loads(text) if text else None
    return results


async def _gone(service: BrokerService, segment: TopicName) -> bool:
    """Whether ``segment`` retired (or was pruned) after its topic's record was read."""
    record = await service.catalog.get(segment.parent())
    if not isinstance(record, ScalableTopic):
        return False  # the topic itself is gone: say so
    info = record.segment(segment.segment or 0)
    return info is None or info.state is SegmentState.RETIRED
