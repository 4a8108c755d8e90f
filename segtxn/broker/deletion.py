"""``DELETE /admin/v2/{topic}``: deleting a topic and its data, and the precondition a
caller can put on it.

A scalable topic's data is on its segments' brokers, so its deletion is several steps, and
one of them commits to it:

1. with connected clients, refuse unless ``force`` (every segment's stats are read first:
   a deletion is refused before anything is deleted, never half-way through);
2. **mark** the topic's record ``deleting``: one compare-and-set on the record
   (:meth:`~segtxn.topics.catalog.Catalog.mark_deleting`). Marked, it starts no split or
   merge, its segments may be deleted (:mod:`.segment_ends`), and nothing unmarks it;
3. delete each segment on its broker, and the children of a split or merge in progress
   (placed and prepared before it completes; from the mark on, none is loaded, so the split
   fails rather than create one again after this step deleted it, and a segment whose
   deletion stopped part-way is never served again afresh: :mod:`.deletemark`);
4. delete the record and its segments' homes, by compare-and-set on the versions read, and
   only if the record is still the one step 2 marked (the store revision that created it):
   never a topic created again under the name after another deletion finished this one.

A crash or a lost broker after step 2 leaves a marked topic: the next ``DELETE`` finishes it.

**The precondition** (``?ifProperty=K&ifPropertyValue=V``, or ``&ifPropertyAbsent=true``:
:mod:`segtxn.protocol.preconditions`) is checked in step 2, on the version of the record
that the compare-and-set replaces. A check and a delete made as two calls can be separated
by someone deleting the topic and creating it again (with other properties, or none); here
a record that changes between the check and the mark fails the mark and is checked again
as it is then, so a topic that does not satisfy the precondition is never marked, and only
a marked topic loses data. When it does not hold: ``PreconditionFailed`` (412), nothing
changed. It is checked once before step 1 as well, only to answer that before reading every
segment. A persistent topic keeps its properties in its ledger on its broker, and its
deletion has no such step, so a precondition on one (or on a segment, which is deleted only
with its topic) is ``NotAllowed``: refused, not ignored.

Every parameter is known or refused (``InvalidArgument``): a misspelt precondition must not
become an unconditional deletion.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from segtxn.broker import arguments, deletemark, segment_ends
from segtxn.broker.fanout import fan_out
from segtxn.broker.http import SERVICE, scalable_record, topic_from
from segtxn.protocol import preconditions
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.limits import parse_bool
from segtxn.protocol.names import Domain, TopicName
from segtxn.protocol.preconditions import PropertyPrecondition
from segtxn.topics.catalog import PreconditionFailed

PARAMETERS = ("force", *preconditions.PARAMETERS)
"""The query parameters a topic's ``DELETE`` takes (its route declares them: any other is
refused before it runs, :func:`segtxn.inputs.takes`)."""


def busy_message(name: TopicName) -> str:
    return f"{name} has connected clients; force=true deletes it anyway, disconnecting them"


async def delete_topic(request: web.Request) -> None:
    """Delete the topic the request names, as the module docstring says.

    Raises:
        ServerError: InvalidArgument (a malformed ``force`` or precondition; an unknown
            parameter is refused before, by its route's declaration); NotAllowed (a
            precondition on a persistent topic or a segment; a segment of a topic not
            being deleted); TopicNotFound; ConsumerBusy (connected
            clients, not forced); PreconditionFailed (nothing was changed); ServiceNotReady
            (a segment's broker is down: a scalable topic marked already stays marked, and
            the next ``DELETE`` finishes it).
    """
    service = request.app[SERVICE]
    name = topic_from(request)
    force = parse_bool(request.query.get("force", "false"), "force")
    precondition = arguments.delete_precondition(request, name)
    if name.domain is Domain.TOPIC:
        await _delete_scalable(request, name, force=force, precondition=precondition)
        return
    await segment_ends.check_deletable(service.catalog, name)
    if name.domain is Domain.PERSISTENT and name not in service.topics:
        found = await deletemark.marked(service.catalog, name)
        if found is not None:  # a deletion of it stopped part-way: finish it, not loaded
            await service.check_home(name)
            await deletemark.finish(service, name, found)
            return
    if name.domain is Domain.SEGMENT and name not in service.topics:
        # (its topic is marked: it is not loaded again, and is deleted as it is left, a
        # retired one, a child a split or merge was making, one a deletion cut short)
        await service.check_home(name)
        await deletemark.finish_segment(service, name)
        return
    topic = await service.serve(name)
    if topic.busy() and not force:
        raise ServerError(ErrorName.CONSUMER_BUSY, busy_message(name))
    await deletemark.delete_loaded(service, name, topic)  # (a persistent topic's record too)


def _has_clients(stats: Any) -> bool:
    """Whether a segment's stats (JSON) show a producer or a consumer."""
    subscriptions = stats.get("subscriptions", {}).values()
    return bool(stats.get("producers")) or any(s.get("consumers") for s in subscriptions)


async def _delete_scalable(
    request: web.Request,
    name: TopicName,
    *,
    force: bool,
    precondition: PropertyPrecondition | None,
) -> None:
    catalog = request.app[SERVICE].catalog
    record = await scalable_record(request.app[SERVICE], name)  # TopicNotFound
    if precondition is not None and not precondition.holds(record.properties):
        raise ServerError(
            ErrorName.PRECONDITION_FAILED, precondition.refusal(str(name), record.properties)
        )
    if not force and not record.deleting:  # refuse before deleting anything, not half-way
        # through (a marked topic's deletion is committed: its segments are not loaded
        # again, and this one finishes it, forced or not)
        per_segment = await fan_out(request, name, "GET", "/stats", record=record, params={})
        if any(_has_clients(s) for s in per_segment.values() if s is not None):
            raise ServerError(ErrorName.CONSUMER_BUSY, busy_message(name))
    try:
        mark = await catalog.mark_deleting(name, precondition)  # its segments may go now
    except PreconditionFailed as e:
        raise ServerError(ErrorName.PRECONDITION_FAILED, str(e)) from e
    if mark is None:
        raise ServerError(ErrorName.TOPIC_NOT_FOUND, f"topic {name} does not exist")
    marked = await catalog.marked(name, mark)
    if marked is None:
        return  # another deletion finished it meanwhile
    segments = {"force": "true" if force else "false"}
    await fan_out(request, name, "DELETE", "", record=marked, params=segments, deleting=True)
    await catalog.finish_deleting(name, mark)
