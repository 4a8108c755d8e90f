"""Kopf handlers of ScalableTopic: the topic created, resharded and deleted through the
brokers' admin API.

``targetSegments`` becomes split/merge calls, one at a time (:func:`topicplan.next_change`
picks each); status shows the DAG the brokers answer with. A long resharding says where it
is while it runs: before each change, condition ``Resharding`` (True, ``step k of n: ...``)
is written straight to the status subresource (:class:`Progress`), since Kopf writes the
handler's own patch only when it returns; at the end ``Resharding`` turns False. What may
heal (brokers unreachable, a topic busy with a change) is a ``kopf.TemporaryError``; a
request segtxn refuses for good (an impossible split) is a ``kopf.PermanentError`` and a
Warning event.

A resource changes and deletes only a topic it created (:mod:`.topicowner`): a topic that
exists already and is not its own is refused (``Ready`` False, ``TopicOwnedElsewhere``, a
Warning event), and deleting the resource leaves it as it is.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import kopf

from segtxn.client.admin import Admin
from segtxn.client.errors import Timeout
from segtxn.operator import topicowner, topicplan
from segtxn.operator.kube import Kube, KubeError
from segtxn.operator.runtime import (
    API,
    GROUP,
    RETRY_S,
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
from segtxn.protocol.errors import PreconditionFailed, ServerError, TopicNotFound

MAX_CHANGES_PER_RUN = 16
"""Splits/merges one handler run makes before handing back to Kopf (and retrying)."""

log = logging.getLogger(__name__)


@dataclass
class Progress:
    """Condition ``Resharding`` of one ScalableTopic, written at each step of a run.

    ``n`` is counted when the run starts (each split adds one active segment, each merge
    removes one: ``|target - active|``) and a step is numbered within its run; a run that
    hands back to Kopf after :data:`MAX_CHANGES_PER_RUN` counts again in the next."""

    kube: Kube
    body: kopf.Body
    conditions: list[dict[str, Any]]
    """As last written (the handler's patch starts from them)."""
    steps: int = 0
    done: int = 0

    async def step(self, reason: str, message: str) -> None:
        """Say that step ``done + 1`` of :attr:`steps` begins. A status write that fails
        is logged, not raised: the resharding itself must not stop for it."""
        text = f"step {self.done + 1} of {self.steps}: {message}"
        self.conditions = self._set(True, reason, text)
        meta = self.body.meta
        try:
            await self.kube.patch_status(
                API, "ScalableTopic", str(meta.namespace), str(meta.name),
                {"conditions": self.conditions},
            )  # fmt: skip
        except (KubeError, aiohttp.ClientError) as e:
            log.warning("%s: resharding status not written (%s): %s", meta.name, text, e)

    def finish(self, reason: str, message: str) -> list[dict[str, Any]]:
        """``Resharding`` False: the run ended (converged, or stopped by an error)."""
        self.conditions = self._set(False, reason, message)
        return self.conditions

    def _set(self, on: bool, reason: str, message: str) -> list[dict[str, Any]]:
        return condition(self.conditions, kind="Resharding", status=on, reason=reason,
                         message=message, now=now(),
                         generation=self.body.meta.get("generation"))  # fmt: skip


async def _converge(
    admin: Admin, topic: str, target: int | None, body: kopf.Body, progress: Progress
) -> Mapping[str, Any]:
    """Split or merge until ``target`` active segments, each step said in ``progress``
    before it is made; returns the final DAG."""
    dag = await admin.stats(topic)
    active = sum(1 for s in dag["segments"] if s["state"] == "ACTIVE")
    progress.steps = 0 if target is None else abs(target - active)
    for _ in range(MAX_CHANGES_PER_RUN):
        change = topicplan.next_change(dag["segments"], target)
        if change is None:
            return dag
        if isinstance(change, topicplan.Split):
            await progress.step("Splitting", f"splitting segment {change.segment}")
            dag = await admin.split(topic, change.segment)
            message = f"segment {change.segment} split (sealed)"
        else:
            pair = f"segments {change.first} and {change.second}"
            await progress.step("Merging", f"merging {pair}")
            dag = await admin.merge(topic, change.first, change.second)
            message = f"{pair} merged (sealed)"
        progress.done += 1
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
    topic = topicplan.topic_of(spec)
    brokers = await admin(runtime, namespace, str(spec["clusterRef"]))
    target = spec.get("targetSegments")
    progress = Progress(runtime.kube, body, [dict(c) for c in status.get("conditions") or ()])
    owner = _owner(body, namespace)

    async def intend(creating: bool) -> None:
        """Status ``creating``: this resource asked for the topic (:mod:`.topicowner`)."""
        await runtime.kube.patch_status(API, "ScalableTopic", namespace, str(body.meta.name),
                                        {"creating": owner.uid if creating else None})  # fmt: skip

    try:
        try:
            created = await topicowner.ensure(
                brokers,
                topic,
                owner,
                segments=int(spec.get("initialSegments", 1)),
                creating=status.get("creating") == owner.uid,
                intend=intend,
            )
        except topicowner.ForeignTopic as e:
            patch.status["conditions"] = condition(
                progress.conditions, kind="Ready", status=False, reason=e.reason,
                message=str(e), now=now(), generation=body.meta.get("generation"),
            )  # fmt: skip
            kopf.warn(body, reason=e.reason, message=str(e))
            raise kopf.PermanentError(str(e)) from e
        except (KubeError, aiohttp.ClientError) as e:  # `creating` not written
            raise kopf.TemporaryError(f"{topic}: status not written: {e}", delay=RETRY_S) from e
        if created:
            patch.status["creating"] = None
            kopf.info(body, reason="Created", message=f"{topic} created")
        dag = await _converge(
            brokers, topic, None if target is None else int(target), body, progress
        )
    except (ServerError, Timeout) as e:
        # Why it is not ready shows in status; a refusal for good also as a Warning event.
        if progress.done < progress.steps:
            stopped = f"stopped after step {progress.done} of {progress.steps}: {e}"
            progress.finish(reason(e), stopped)
        patch.status["conditions"] = condition(
            progress.conditions,
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
    patch.status.update(topicplan.topic_status(dag, topic))
    patch.status["observedGeneration"] = body.meta.get("generation")
    active = int(patch.status["activeSegments"])
    made = f"{progress.done} of {progress.steps} steps made" if progress.steps else "no step"
    progress.finish("Converged", f"{made}; {active} active segments")
    patch.status["conditions"] = condition(
        progress.conditions,
        kind="Ready",
        status=True,
        reason="Converged" if target is None or active == int(target) else "AtLimit",
        message=f"{active} active segments",
        now=now(),
        generation=body.meta.get("generation"),
    )


def _owner(body: kopf.Body, namespace: str) -> topicowner.Owner:
    return topicowner.Owner(str(body.meta.uid), f"{namespace}/{body.meta.name}")


@kopf.on.delete(GROUP, VERSION, "scalabletopics")
async def delete_topic(
    *,
    body: kopf.Body,
    namespace: str | None,
    spec: kopf.Spec,
    status: kopf.Status,
    memo: Any,
    **_: Any,
) -> None:
    """Delete the topic, its segments and their data (unless ``deleteData`` is false), if
    this resource created it (:mod:`.topicowner`: checked by the brokers in the step that
    deletes); another's topic is left as it is."""
    namespace = namespaced(namespace)
    if not spec.get("deleteData", True):
        return
    runtime = runtime_of(memo)
    topic = topicplan.topic_of(spec)
    try:
        brokers = await admin(runtime, namespace, str(spec["clusterRef"]))
    except kopf.TemporaryError:
        kopf.warn(body, reason="ClusterGone", message=f"{topic}: its cluster is gone")
        return  # nothing left to delete the data from; do not hold the resource forever
    owner = _owner(body, namespace)
    creating = status.get("creating") == owner.uid
    try:
        deleted = await topicowner.delete(brokers, topic, owner, creating=creating)
    except TopicNotFound:
        return
    except PreconditionFailed as e:  # it keeps changing under the deletion: look later
        raise kopf.TemporaryError(f"deleting {topic}: {e}", delay=RETRY_S) from e
    except (ServerError, Timeout) as e:
        raise kopf_error(e, f"deleting {topic}") from e
    if not deleted:
        message = f"{topic} was not created by this ScalableTopic: left as it is"
        kopf.info(body, reason="Kept", message=message)
        return
    kopf.info(body, reason="Deleted", message=f"{topic} and its data deleted")
