"""Kopf handlers of ScalableTopic: the topic created, resharded and deleted through the
brokers' admin API.

``targetSegments`` becomes split/merge calls, one at a time (:func:`render.next_change`
picks each); status shows the DAG the brokers answer with. What may heal (brokers
unreachable, a topic busy with a change) is a ``kopf.TemporaryError``; a request segtxn
refuses for good (an impossible split) is a ``kopf.PermanentError`` and a Warning event.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from segtxn.client.admin import Admin
from segtxn.client.errors import Timeout
from segtxn.operator import render
from segtxn.operator.runtime import (
    GROUP,
    VERSION,
    admin,
    kopf_error,
    namespaced,
    now,
    reason,
    runtime_of,
    transient,
)
from segtxn.operator.status import condition
from segtxn.protocol.errors import ServerError, TopicAlreadyExists, TopicNotFound

MAX_CHANGES_PER_RUN = 16
"""Splits/merges one handler run makes before handing back to Kopf (and retrying)."""


async def _converge(
    admin: Admin, topic: str, target: int | None, body: kopf.Body
) -> Mapping[str, Any]:
    """Split or merge until ``target`` active segments; returns the final DAG."""
    dag = await admin.stats(topic)
    for _ in range(MAX_CHANGES_PER_RUN):
        change = render.next_change(dag["segments"], target)
        if change is None:
            return dag
        if isinstance(change, render.Split):
            dag = await admin.split(topic, change.segment)
            message = f"segment {change.segment} split (sealed)"
        else:
            dag = await admin.merge(topic, change.first, change.second)
            message = f"segments {change.first} and {change.second} merged (sealed)"
        kopf.info(body, reason="Resharded", message=f"{topic}: {message}")
    raise kopf.TemporaryError(f"{topic}: more changes to make towards {target}", delay=1)


@kopf.on.resume(GROUP, VERSION, "scalabletopics")
@kopf.on.create(GROUP, VERSION, "scalabletopics")
@kopf.on.update(GROUP, VERSION, "scalabletopics", field="spec")
async def reconcile_topic(
    *,
    body: kopf.Body,
    namespace: str | None,
    spec: kopf.Spec,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: Any,
    **_: Any,
) -> None:
    namespace = namespaced(namespace)
    runtime = runtime_of(memo)
    topic = render.topic_of(spec)
    brokers = await admin(runtime, namespace, str(spec["clusterRef"]))
    target = spec.get("targetSegments")
    try:
        try:
            await brokers.create_topic(topic, segments=int(spec.get("initialSegments", 1)))
            kopf.info(body, reason="Created", message=f"{topic} created")
        except TopicAlreadyExists:
            pass
        dag = await _converge(brokers, topic, None if target is None else int(target), body)
    except (ServerError, Timeout) as e:
        # Why it is not ready shows in status; a refusal for good also as a Warning event.
        patch.status["conditions"] = condition(
            status.get("conditions"),
            kind="Ready",
            status=False,
            reason=reason(e),
            message=str(e),
            now=now(),
            generation=body.meta.get("generation"),
        )
        if not transient(e):
            kopf.warn(body, reason="Refused", message=f"{topic}: {e}")
        raise kopf_error(e, topic) from e
    patch.status.update(render.topic_status(dag, topic))
    patch.status["observedGeneration"] = body.meta.get("generation")
    active = int(patch.status["activeSegments"])
    patch.status["conditions"] = condition(
        status.get("conditions"),
        kind="Ready",
        status=True,
        reason="Converged" if target is None or active == int(target) else "AtLimit",
        message=f"{active} active segments",
        now=now(),
        generation=body.meta.get("generation"),
    )


@kopf.on.delete(GROUP, VERSION, "scalabletopics")
async def delete_topic(
    *, body: kopf.Body, namespace: str | None, spec: kopf.Spec, memo: Any, **_: Any
) -> None:
    """Delete the topic, its segments and their data (unless ``deleteData`` is false)."""
    namespace = namespaced(namespace)
    if not spec.get("deleteData", True):
        return
    runtime = runtime_of(memo)
    topic = render.topic_of(spec)
    try:
        brokers = await admin(runtime, namespace, str(spec["clusterRef"]))
    except kopf.TemporaryError:
        kopf.warn(body, reason="ClusterGone", message=f"{topic}: its cluster is gone")
        return  # nothing left to delete the data from; do not hold the resource forever
    try:
        await brokers.delete_topic(topic, force=True)
    except TopicNotFound:
        return
    except (ServerError, Timeout) as e:
        raise kopf_error(e, f"deleting {topic}") from e
    kopf.info(body, reason="Deleted", message=f"{topic} and its data deleted")
