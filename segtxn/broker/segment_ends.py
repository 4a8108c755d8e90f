"""How a segment of a scalable topic may end: only as its topic's DAG says.

A scalable topic routes each key to the ACTIVE segment whose range covers its hash, and a
client that meets a sealed segment looks the topic up again, expecting the DAG to name the
segment's children by then. A segment sealed on its own (``POST .../segment/.../terminate``)
while the DAG still says ACTIVE breaks that: every send of a key in its range is refused,
the lookup sends it back to the same segment, and the send times out, for ever (issue found
by a new-user trial). So a segment is sealed only

- by a split or merge: its topic's controller plans the change first (the record's
  ``pending`` operation names the segment among its parents) and then seals it through the
  same admin call on the segment's home broker (:class:`~segtxn.broker.controllers.HttpSegmentOps`);
- or again, once it is sealed (sealing is idempotent: a controller that died part-way seals
  again, and its successor too).

A segment deleted on its own (``DELETE .../segment/...``) is worse: its keys stay routed to
it, and its messages no subscription has read are gone. So a segment is deleted only with
its topic: the topic's deletion marks its record ``deleting`` first, then deletes each
segment through the same admin call, then the record (a segment whose topic's record is gone
may be deleted too: a deletion that stopped half-way is finished so).

The checks read the topic's record from the store, which the controller or the deletion
wrote before it asked, so they are not told apart by who calls (a header any caller could
send) but by what the record says. A scalable topic as a whole cannot be terminated (its
DAG has no state for it yet): the admin API refuses that too.
"""

from __future__ import annotations

from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.names import Domain, TopicName
from segtxn.topics.catalog import Catalog
from segtxn.topics.model import ScalableTopic, SegmentState


async def check_sealable(catalog: Catalog, name: TopicName) -> None:
    """Raise unless ``name`` may be sealed now: a persistent topic always; a segment when
    it is a parent of its topic's split or merge in progress, or no longer ACTIVE.

    Raises:
        ServerError(NotAllowed): a scalable topic, or an ACTIVE segment no split or merge
            is sealing.
        ServerError(TopicNotFound): a segment its topic's record does not hold.
    """
    if name.domain is Domain.TOPIC:
        raise ServerError(
            ErrorName.NOT_ALLOWED,
            f"{name} is a scalable topic: terminating one is not supported; "
            "its segments are sealed only by splits and merges",
        )
    if name.domain is not Domain.SEGMENT:
        return
    topic = name.parent()
    record = await catalog.get(topic)
    info = record.segment(name.segment or 0) if isinstance(record, ScalableTopic) else None
    if not isinstance(record, ScalableTopic) or info is None:
        raise ServerError(ErrorName.TOPIC_NOT_FOUND, f"topic {name} does not exist")
    if info.state is not SegmentState.ACTIVE:
        return
    if record.pending is not None and info.id in record.pending.parents:
        return
    raise ServerError(
        ErrorName.NOT_ALLOWED,
        f"{name} is an active segment of {topic}: a segment is sealed only by a split or "
        f"merge of its topic (POST /admin/v2/{topic.path}/split?segment={info.id} or "
        f"/merge), which routes its keys to the new segments; sealed alone, every send of "
        "a key in its range would be refused until then",
    )


async def check_deletable(catalog: Catalog, name: TopicName) -> None:
    """Raise unless ``name`` may be deleted now: anything but a segment; a segment when its
    topic is being deleted (or its record is gone).

    Raises:
        ServerError(NotAllowed): a segment of a topic that is not being deleted.
    """
    if name.domain is not Domain.SEGMENT:
        return
    topic = name.parent()
    record = await catalog.get(topic)
    if not isinstance(record, ScalableTopic) or record.deleting:
        return
    raise ServerError(
        ErrorName.NOT_ALLOWED,
        f"{name} is a segment of {topic}: a segment is deleted only with its topic "
        f"(DELETE /admin/v2/{topic.path}); deleted alone, its keys would still be routed to "
        "it and its unread messages would be lost",
    )
