"""The admin REST API (``/admin/v2/...``, shaped like Pulsar's); lookup is in :mod:`.lookup`.

Topic paths are ``{domain}/{tenant}/{namespace}/{topic}`` (plus ``/{segment}`` for
``segment://``). Operations on a ``persistent://`` topic or a segment run on its home broker
(others answer 307 to it); operations on a scalable topic (``topic://``) fan out to the home
of each of its segments (:mod:`.fanout`); a topic's deletion is :mod:`.deletion`. Errors:
``{"error": NAME, "message": ...}`` with a fitting status.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from segtxn.broker import arguments, cursor_repair, deletion, retire, segment_ends, v4ends
from segtxn.broker.fanout import HTTP, fan_out
from segtxn.broker.http import SERVICE, check_name, json_errors, scalable_record, topic_from
from segtxn.broker.service import BrokerService
from segtxn.broker.stats import loaded_stats, retired_stats, sealed_stats
from segtxn.inputs import read_json, takes
from segtxn.ledger.sealed import read_sealed
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.limits import MAX_SEGMENT_ID, parse_int, parse_key_hash
from segtxn.protocol.names import Domain, TopicName
from segtxn.topics.catalog import NoBrokers, TopicExists
from segtxn.topics.controller import TopicBusy
from segtxn.topics.dag import DagError
from segtxn.topics.model import PersistentTopic, ScalableTopic
from segtxn.web import relay

# ---------------------------------------------------------------------- topics


def _change(topic: ScalableTopic) -> dict[str, Any] | None:
    change = topic.last_change
    if change is None:
        return None
    return {
        "kind": change.kind.value,
        "parents": change.parents,
        "children": change.children,
        "finishedMs": change.finished_ms,
        "durationMs": change.duration_ms,
    }


@takes("segments")
@json_errors
async def create_topic(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE]
    name = topic_from(request)
    await _create(service, name, segments=arguments.segments_to_create(request, name))
    return web.Response(status=204)


async def _create(
    service: BrokerService, name: TopicName, *, segments: int = 1
) -> PersistentTopic | ScalableTopic:
    """Create a persistent or scalable topic (placed on live brokers).

    Raises:
        ServerError(TopicAlreadyExists / InvalidArgument / ServiceNotReady)
    """
    try:
        if name.domain is Domain.PERSISTENT:
            await service.catalog.create_persistent(name)
        elif name.domain is Domain.TOPIC:
            try:
                await service.catalog.create_scalable(name, segments)
            except ValueError as e:
                raise ServerError(ErrorName.INVALID_ARGUMENT, str(e)) from e
        else:
            raise ServerError(ErrorName.NOT_ALLOWED, "segments are created by their scalable topic")
    except TopicExists as e:
        raise ServerError(ErrorName.TOPIC_EXISTS, str(e)) from e
    except NoBrokers as e:
        raise ServerError(ErrorName.SERVICE_NOT_READY, str(e)) from e
    record = await service.catalog.get(name)
    assert record is not None
    return record


@takes(*deletion.PARAMETERS)
@json_errors
async def delete_topic(request: web.Request) -> web.StreamResponse:
    """Delete a topic and its data (:mod:`.deletion`: the steps, and the precondition)."""
    await deletion.delete_topic(request)
    return web.Response(status=204)


@json_errors
async def list_topics(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE]
    wanted, tenant, namespace = arguments.listed_namespace(request)
    names = await service.catalog.list_topics(tenant, namespace)
    return web.json_response([str(n) for n in names if n.domain.value == wanted])


@json_errors
async def stats(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE]
    name = topic_from(request)
    if name.domain is Domain.TOPIC:
        record = await scalable_record(service, name)
        per_segment = await fan_out(request, name, "GET", "/stats")
        return web.json_response(
            {
                "topic": str(name),
                "epoch": record.epoch,
                "segments": [
                    {
                        "id": s.id,
                        "range": [s.lo, s.hi],
                        "state": s.state,
                        "parents": s.parents,
                        "children": s.children,
                        "stats": per_segment.get(str(s.id)),
                    }
                    for s in record.segments
                ],
                "activeSegments": len(record.active()),
                "lastChange": _change(record),
            }
        )
    topic = service.topics.get(name)
    if topic is None:  # a sealed one is answered from its records, not loaded for this
        await service.check_home(name)
        ledger = await read_sealed(
            service.store,
            str(name),
            max_persisted_ranges=service.settings.ledger.max_persisted_ranges,
        )
        if ledger is not None:
            return web.json_response(sealed_stats(name, ledger))
        if name.domain is Domain.SEGMENT and await retire.is_retired(service.catalog, name):
            return web.json_response(retired_stats(name))
    return web.json_response(loaded_stats(await service.serve(name)))


# ---------------------------------------------------------------------- subscriptions


@json_errors
async def list_subscriptions(request: web.Request) -> web.StreamResponse:
    name = topic_from(request)
    if name.domain is Domain.TOPIC:
        per_segment = await fan_out(request, name, "GET", "/subscriptions")
        return web.json_response(sorted({s for subs in per_segment.values() for s in subs}))
    topic = await request.app[SERVICE].serve(name)
    return web.json_response(topic.subscription_names())


@takes("initial")
@json_errors
async def create_subscription(request: web.Request) -> web.StreamResponse:
    name = topic_from(request)
    subscription = _subscription_name(request)
    initial = request.query.get("initial", "latest")
    if initial not in ("earliest", "latest"):
        raise ServerError(ErrorName.INVALID_ARGUMENT, "initial: earliest or latest")
    if name.domain is Domain.TOPIC:
        await fan_out(request, name, "PUT", f"/subscription/{subscription}")
        # and on the children of a split or merge in progress, already placed (empty until
        # it completes: from the start), which its controller may have prepared before
        await fan_out(
            request,
            name,
            "PUT",
            f"/subscription/{subscription}",
            only_creating=True,
            params={"initial": "earliest"},
        )
        return web.Response(status=204)
    topic = await request.app[SERVICE].serve(name)
    await topic.subscription(subscription, initial=initial)
    return web.Response(status=204)


@json_errors
async def delete_subscription(request: web.Request) -> web.StreamResponse:
    name = topic_from(request)
    subscription = _subscription_name(request)
    if name.domain is Domain.TOPIC:
        # Each segment's delete as it is: one that stopped part-way (a consumer on a later
        # segment) is retried to its end, and only a subscription no segment has is not found.
        answers = await fan_out(
            request,
            name,
            "DELETE",
            f"/subscription/{subscription}",
            settled_by=ErrorName.SUBSCRIPTION_NOT_FOUND,
        )
        missing = [a for a in answers.values() if isinstance(a, ServerError)]
        if missing and len(missing) == len(answers):
            raise ServerError(
                ErrorName.SUBSCRIPTION_NOT_FOUND, f"{name} has no subscription {subscription!r}"
            )
        return web.Response(status=204)
    topic = await request.app[SERVICE].serve(name)
    await topic.delete_subscription(subscription)
    return web.Response(status=204)


@takes("to")
@json_errors
async def reset_subscription(request: web.Request) -> web.StreamResponse:
    name = topic_from(request)
    subscription = _subscription_name(request)
    to = request.query.get("to", "")
    if name.domain is Domain.TOPIC:
        if to not in ("earliest", "latest"):
            raise ServerError(
                ErrorName.INVALID_ARGUMENT,
                f"to: a scalable topic resets to earliest or latest, not {to[:40]!r} (a "
                "position names one segment's entry)",
            )
        await fan_out(request, name, "POST", f"/subscription/{subscription}/reset")
        return web.Response(status=204)
    topic = await request.app[SERVICE].serve(name)
    target = arguments.reset_target(to, topic.ledger.next_write_position())
    await topic.reset_subscription(subscription, target)
    return web.Response(status=204)


def _subscription_name(request: web.Request) -> str:
    return check_name("subscription", request.match_info["subscription"])


# ---------------------------------------------------------------------- properties


@json_errors
async def get_properties(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE]
    name = topic_from(request)
    if name.domain is Domain.TOPIC:
        return web.json_response((await scalable_record(service, name)).properties)
    topic = await service.serve(name)
    return web.json_response(topic.properties)


@json_errors
async def update_properties(request: web.Request) -> web.StreamResponse:
    updates = arguments.property_updates(await read_json(request))
    await _change_properties(request, updates, ())
    return web.Response(status=204)


@takes("key")
@json_errors
async def remove_property(request: web.Request) -> web.StreamResponse:
    key = request.query.get("key")
    if not key:
        raise ServerError(ErrorName.INVALID_ARGUMENT, "which property? (?key=...)")
    await _change_properties(request, {}, (key,))
    return web.Response(status=204)


async def _change_properties(
    request: web.Request, updates: dict[str, str], removals: tuple[str, ...]
) -> None:
    from segtxn.broker.topic import SYSTEM_PROPERTY_PREFIX

    service = request.app[SERVICE]
    name = topic_from(request)
    if name.domain is Domain.TOPIC:
        for key in [*updates, *removals]:
            if key.startswith(SYSTEM_PROPERTY_PREFIX):
                raise ServerError(ErrorName.NOT_ALLOWED, f"{key!r} is a system property")
        try:
            await service.catalog.update_properties(
                name, updates, removals, check=arguments.check_properties
            )
        except KeyError:
            raise ServerError(ErrorName.TOPIC_NOT_FOUND, f"topic {name} does not exist") from None
        return
    topic = await service.serve(name)
    await topic.update_properties(updates, removals)


# ---------------------------------------------------------------------- topology


@json_errors
async def terminate(request: web.Request) -> web.StreamResponse:
    """Seal a persistent topic, or a segment a split or merge is sealing (only its topic's
    controller calls this for a segment: :mod:`.segment_ends`): no more writes; reads and acks
    go on."""
    service = request.app[SERVICE]
    name = topic_from(request)
    await segment_ends.check_sealable(service.catalog, name)
    last = await service.seal(name)
    return web.json_response({"lastPosition": None if last is None else str(last)})


@json_errors
async def trim(request: web.Request) -> web.StreamResponse:
    """Apply the broker's retention policy now (Pulsar's trimTopic), as the periodic pass
    does: delete the ledgers it lets go, never unconsumed data. Fans out on a scalable
    topic (``{"segments": {id: result}}``)."""
    name = topic_from(request)
    if name.domain is Domain.TOPIC:
        return web.json_response({"segments": await fan_out(request, name, "POST", "/trim")})
    topic = await request.app[SERVICE].serve(name)
    result = await topic.trim()
    first = result.first_retained
    return web.json_response(
        {
            "trimmedLedgers": result.ledgers,
            "trimmedEntries": result.entries,
            "firstRetained": None if first is None else str(first),
        }
    )


@json_errors
async def load(request: web.Request) -> web.StreamResponse:
    """Open a topic or segment on its home broker now (creating its ledger)."""
    await request.app[SERVICE].serve(topic_from(request))
    return web.Response(status=204)


def _dag(topic: ScalableTopic) -> dict[str, Any]:
    return {
        "epoch": topic.epoch,
        "segments": [
            {
                "id": s.id,
                "range": [s.lo, s.hi],
                "state": s.state,
                "parents": s.parents,
                "children": s.children,
            }
            for s in topic.segments
        ],
    }


async def _as_controller(
    request: web.Request, change: Callable[[TopicName], Awaitable[ScalableTopic]]
) -> web.StreamResponse:
    """Run a topology change here if this broker is (or becomes) the topic's controller;
    otherwise forward the request to the controller."""
    service = request.app[SERVICE]
    name = topic_from(request)
    if name.domain is not Domain.TOPIC:
        raise ServerError(ErrorName.NOT_ALLOWED, f"{name}: only scalable topics split and merge")
    leader = await service.controllers.leader(name)
    if leader is not None:
        return await relay(request.app[HTTP], request, leader)
    try:
        return web.json_response(_dag(await change(name)))
    except DagError as e:
        raise ServerError(ErrorName.INVALID_ARGUMENT, f"{name}: {e}") from e
    except TopicBusy as e:
        raise ServerError(ErrorName.TOPIC_BUSY, str(e)) from e
    except KeyError:
        raise ServerError(ErrorName.TOPIC_NOT_FOUND, f"topic {name} does not exist") from None


@takes("segment", "at")
@json_errors
async def split(request: web.Request) -> web.StreamResponse:
    given = request.query.get("segment")
    if given is None:
        raise ServerError(ErrorName.INVALID_ARGUMENT, "which segment? (?segment=ID[&at=HASH])")
    segment = parse_int(given, "segment", hi=MAX_SEGMENT_ID)
    point = request.query.get("at")
    at = None if point is None else parse_key_hash(point, "at")
    controllers = request.app[SERVICE].controllers
    return await _as_controller(request, lambda name: controllers.split(name, segment, at))


@takes("segments")
@json_errors
async def merge(request: web.Request) -> web.StreamResponse:
    parts = request.query.get("segments", "").split(",")
    if len(parts) != 2:
        raise ServerError(ErrorName.INVALID_ARGUMENT, "which segments? (?segments=A,B)")
    first, second = (parse_int(p.strip(), "segments") for p in parts)
    controllers = request.app[SERVICE].controllers
    return await _as_controller(request, lambda name: controllers.merge(name, first, second))


def routes() -> list[web.RouteDef]:
    topic = "/{domain}/{tenant}/{namespace}/{topic}"  # the parser names a bad domain
    segment = "/{domain:segment}/{tenant}/{namespace}/{topic}/{segment:[0-9]+}"
    out: list[web.RouteDef] = [
        web.get("/admin/v2/{domain}/{tenant}/{namespace}", list_topics),
    ]
    for shape in (topic, segment):
        base = "/admin/v2" + shape
        out += [
            web.put(base, create_topic),
            web.delete(base, delete_topic),
            web.get(base + "/stats", stats),
            web.get(base + "/subscriptions", list_subscriptions),
            web.put(base + "/subscription/{subscription}", create_subscription),
            web.delete(base + "/subscription/{subscription}", delete_subscription),
            web.post(base + "/subscription/{subscription}/reset", reset_subscription),
            web.post(base + "/subscription/{subscription}/repair", cursor_repair.repair),
            web.get(base + "/properties", get_properties),
            web.put(base + "/properties", update_properties),
            web.delete(base + "/properties", remove_property),
            web.post(base + "/terminate", terminate),
            web.post(base + "/trim", trim),
            web.post(base + "/txn/{txn}/end", v4ends.end_txn_on_partition),
            web.post(
                base + "/subscription/{subscription}/txn/{txn}/end", v4ends.end_txn_on_subscription
            ),
            web.post(base + "/load", load),
            web.post(base + "/split", split),
            web.post(base + "/merge", merge),
        ]
    return out
