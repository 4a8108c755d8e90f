"""Kopf handlers: SegtxnCluster, TransactionCoordinator and ScalableTopic reconciled.

Run as ``segtxn operator`` (``kopf run -m segtxn.operator.handlers`` works too). Rendering
is pure (:mod:`segtxn.operator.render`); these handlers apply it with owner references,
report status and conditions, post events, and hold finalizers:

- SegtxnCluster: children applied on create/update/resume; a timer reads broker readiness;
  deletion waits until no ScalableTopic or TransactionCoordinator refers to the cluster.
- TransactionCoordinator: children applied (the cluster must exist); a timer reads
  ``/txn/v2/stats`` into status and raises ``GCBacklogHigh`` above the threshold.
- ScalableTopic: created through the brokers' admin API; ``targetSegments`` becomes
  split/merge calls, one at a time; status shows the DAG; deletion deletes the topic.

Errors: what may heal (the cluster not there yet, brokers unreachable, a topic busy with
a change) is a ``kopf.TemporaryError`` with a delay; a request segtxn refuses for good
(an impossible split) is a ``kopf.PermanentError`` and a Warning event.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import kopf

from segtxn.client.admin import Admin
from segtxn.client.connection import Connector
from segtxn.client.errors import Timeout
from segtxn.operator import render
from segtxn.operator.kube import Kube, KubeError, KubeUnreachable
from segtxn.protocol.errors import ErrorName, ServerError

GROUP, VERSION = render.GROUP, render.VERSION
API = f"{GROUP}/{VERSION}"
FINALIZER = "segtxn.io/finalizer"
RETRY_S = 5.0
"""Delay before retrying what may heal by itself."""
MAX_CHANGES_PER_RUN = 16
"""Splits/merges one handler run makes before handing back to Kopf (and retrying)."""
STATUS_TICK_S = 1.0
"""How often status timers wake; each resource's own interval decides when they read."""

_TRANSIENT = {
    ErrorName.SERVICE_NOT_READY,
    ErrorName.TOPIC_BUSY,
    ErrorName.TOO_MANY_REQUESTS,
    ErrorName.METADATA,
    ErrorName.NOT_OWNER,
}


@dataclass(frozen=True)
class OperatorConfig:
    """How the operator reaches segtxn. In a pod it derives each cluster's Service URL
    (:func:`render.service_url`); run outside Kubernetes (a laptop, the tests) the URLs
    are given: every cluster is then reached there."""

    broker_url: str | None = None
    coordinator_url: str | None = None
    api_timeout_s: float = 15.0
    """At start-up, how long to keep trying to reach the Kubernetes API before giving up
    (a PermanentError: the operator exits saying so)."""


@dataclass
class Runtime:
    """What the handlers share, built at start-up (kept in Kopf's memo)."""

    config: OperatorConfig
    kube: Kube
    http: aiohttp.ClientSession
    closed: bool = False


def _runtime(memo: Any) -> Runtime:
    runtime = memo.get("runtime")
    if not isinstance(runtime, Runtime):
        raise kopf.TemporaryError("the operator is still starting", delay=1)
    if runtime.closed:  # timers may still tick while Kopf stops
        raise kopf.TemporaryError("the operator is stopping", delay=60)
    return runtime


def _namespaced(namespace: str | None) -> str:
    if namespace is None:  # the CRDs are namespaced: only a broken API server sends this
        raise kopf.PermanentError("segtxn resources are namespaced")
    return namespace


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------- start-up


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Progress and diff-base in annotations: status stays ours and matches the CRD schema.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = FINALIZER
    settings.posting.level = logging.INFO
    # The CRDs are installed before the operator (helm's crds/); no runtime discovery.
    settings.scanning.disabled = True
    config = memo.get("config") or OperatorConfig()
    try:
        info = memo.get("connection") or (
            kopf.login_with_service_account(settings=settings)
            or kopf.login_with_kubeconfig(settings=settings)
        )
    except (OSError, ValueError, KeyError, kopf.LoginError) as e:
        raise kopf.PermanentError(f"cannot read Kubernetes credentials: {e!r}") from e
    if info is None:
        raise kopf.PermanentError("no Kubernetes credentials (service account or kubeconfig)")
    kube = Kube(info)
    try:
        await kube.wait_reachable(config.api_timeout_s)
    except (KubeUnreachable, KubeError) as e:
        await kube.close()
        raise kopf.PermanentError(str(e)) from e
    except BaseException:
        await kube.close()
        raise
    memo["runtime"] = Runtime(config, kube, aiohttp.ClientSession())


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    runtime = memo.get("runtime")
    if isinstance(runtime, Runtime):
        runtime.closed = True
        await runtime.kube.close()
        await runtime.http.close()


# ---------------------------------------------------------------------- indexes


@kopf.index(GROUP, VERSION, "scalabletopics")
def topics_by_cluster(
    *, namespace: str | None, name: str, spec: kopf.Spec, **_: Any
) -> dict[tuple[str | None, str], str]:
    return {(namespace, str(spec.get("clusterRef"))): name}


@kopf.index(GROUP, VERSION, "transactioncoordinators")
def coordinators_by_cluster(
    *, namespace: str | None, name: str, spec: kopf.Spec, **_: Any
) -> dict[tuple[str | None, str], str]:
    return {(namespace, str(spec.get("clusterRef"))): name}


# ---------------------------------------------------------------------- helpers


async def _apply(
    runtime: Runtime,
    body: kopf.Body,
    status: kopf.Status,
    patch: kopf.Patch,
    objects: list[render.Obj],
) -> None:
    """Create or update the resource's children (owned by it), then say so: status
    (``observedGeneration``, condition ``Applied``) and an event."""
    kopf.adopt(objects, owner=body)
    try:
        for obj in objects:
            await runtime.kube.apply(obj)
    except KubeError as e:
        if e.status in (400, 403, 422):
            raise kopf.PermanentError(f"Kubernetes refused a child: {e}") from e
        raise kopf.TemporaryError(f"applying children: {e}", delay=RETRY_S) from e
    except aiohttp.ClientError as e:
        raise kopf.TemporaryError(f"applying children: {e!r}", delay=RETRY_S) from e
    message = f"{len(objects)} objects applied"
    patch.status["observedGeneration"] = body.meta.get("generation")
    patch.status["conditions"] = render.condition(
        status.get("conditions"),
        kind="Applied",
        status=True,
        reason="Rendered",
        message=message,
        now=_now(),
    )
    kopf.info(body, reason="Applied", message=message)


async def _cluster_spec(runtime: Runtime, namespace: str, cluster: str) -> Mapping[str, Any]:
    found = await runtime.kube.get(API, "SegtxnCluster", namespace, cluster)
    if found is None:
        raise kopf.TemporaryError(
            f"SegtxnCluster {namespace}/{cluster} does not exist (yet)", delay=RETRY_S
        )
    return dict(found.get("spec", {}))


async def _admin(runtime: Runtime, namespace: str, cluster: str) -> Admin:
    url = runtime.config.broker_url
    if url is None:
        spec = await _cluster_spec(runtime, namespace, cluster)
        url = render.service_url(cluster, namespace, spec)
    return Admin(Connector(url, runtime.http, request_timeout_s=30))


def _reason(e: ServerError | Timeout) -> str:
    """A condition's reason: the error's wire name, or Timeout (no answer in time)."""
    return e.name.value if isinstance(e, ServerError) else "Timeout"


def _transient(e: ServerError | Timeout) -> bool:
    return isinstance(e, Timeout) or e.name in _TRANSIENT


def _kopf_error(e: ServerError | Timeout, doing: str) -> kopf.TemporaryError | kopf.PermanentError:
    """Retry what may heal (brokers unreachable or not answering in time, a change in
    progress); not the rest."""
    if _transient(e):
        return kopf.TemporaryError(f"{doing}: {e}", delay=RETRY_S)
    return kopf.PermanentError(f"{doing}: {e}")


# ---------------------------------------------------------------------- SegtxnCluster


@kopf.on.resume(GROUP, VERSION, "segtxnclusters")
@kopf.on.create(GROUP, VERSION, "segtxnclusters")
@kopf.on.update(GROUP, VERSION, "segtxnclusters", field="spec")
async def reconcile_cluster(
    *,
    body: kopf.Body,
    name: str,
    namespace: str | None,
    spec: kopf.Spec,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: Any,
    **_: Any,
) -> None:
    namespace = _namespaced(namespace)
    runtime = _runtime(memo)
    await _apply(runtime, body, status, patch, render.render_cluster(name, namespace, spec))
    patch.status["serviceUrl"] = render.service_url(name, namespace, spec)
    patch.status["phase"] = status.get("phase") or "Pending"


@kopf.timer(GROUP, VERSION, "segtxnclusters", interval=STATUS_TICK_S * 5)
async def cluster_readiness(
    *,
    name: str,
    namespace: str | None,
    spec: kopf.Spec,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: Any,
    body: kopf.Body,
    **_: Any,
) -> None:
    namespace = _namespaced(namespace)
    runtime = _runtime(memo)
    names = render.ClusterNames(name)
    found = await runtime.kube.get("apps/v1", "StatefulSet", namespace, names.brokers)
    ready = int((found or {}).get("status", {}).get("readyReplicas") or 0)
    wanted = int(spec.get("brokers", {}).get("replicas", 3))
    phase = "Ready" if ready >= wanted else ("Degraded" if ready else "Pending")
    if status.get("readyBrokers") == ready and status.get("phase") == phase:
        return
    patch.status["readyBrokers"] = ready
    patch.status["phase"] = phase
    patch.status["conditions"] = render.condition(
        status.get("conditions"),
        kind="Ready",
        status=ready >= wanted,
        reason=phase,
        message=f"{ready}/{wanted} brokers ready",
        now=_now(),
    )
    if phase == "Ready":
        kopf.info(body, reason="Ready", message=f"{ready}/{wanted} brokers ready")


@kopf.on.delete(GROUP, VERSION, "segtxnclusters")
async def delete_cluster(
    *,
    name: str,
    namespace: str | None,
    patch: kopf.Patch,
    **indexes: Any,
) -> None:
    """Refuse to go while topics or coordinators refer to the cluster (their own deletion
    needs the brokers); the children then go with their owner (owner references)."""
    namespace = _namespaced(namespace)
    topics = sorted(indexes["topics_by_cluster"].get((namespace, name), []))
    coordinators = sorted(indexes["coordinators_by_cluster"].get((namespace, name), []))
    if topics or coordinators:
        patch.status["phase"] = "Deleting"
        waiting = [f"ScalableTopic/{t}" for t in topics] + [
            f"TransactionCoordinator/{c}" for c in coordinators
        ]
        raise kopf.TemporaryError(f"waiting for {', '.join(waiting)} to be deleted", delay=RETRY_S)


# ---------------------------------------------------------------------- TransactionCoordinator


@kopf.on.resume(GROUP, VERSION, "transactioncoordinators")
@kopf.on.create(GROUP, VERSION, "transactioncoordinators")
@kopf.on.update(GROUP, VERSION, "transactioncoordinators", field="spec")
async def reconcile_coordinator(
    *,
    body: kopf.Body,
    name: str,
    namespace: str | None,
    spec: kopf.Spec,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: Any,
    **_: Any,
) -> None:
    namespace = _namespaced(namespace)
    runtime = _runtime(memo)
    cluster = await _cluster_spec(runtime, namespace, str(spec["clusterRef"]))
    objects = render.render_coordinator(name, namespace, spec, cluster)
    await _apply(runtime, body, status, patch, objects)


@kopf.timer(GROUP, VERSION, "transactioncoordinators", interval=STATUS_TICK_S)
async def coordinator_status(
    *,
    body: kopf.Body,
    name: str,
    namespace: str | None,
    spec: kopf.Spec,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: Any,
    **_: Any,
) -> None:
    """Every ``statusIntervalSeconds``: open transactions and the GC backlog into status;
    ``GCBacklogHigh`` when the backlog passes ``gcBacklogThreshold``."""
    namespace = _namespaced(namespace)
    last = status.get("lastChecked")
    interval = float(spec.get("statusIntervalSeconds", 30))
    now = datetime.datetime.now(datetime.UTC)
    if last and (now - datetime.datetime.fromisoformat(last)).total_seconds() < interval:
        return
    runtime = _runtime(memo)
    url = runtime.config.coordinator_url or render.coordinator_url(name, namespace, spec)
    found = await runtime.kube.get(
        "apps/v1", "Deployment", namespace, render.coordinator_name(name)
    )
    conditions = status.get("conditions")
    stamp = _now()
    patch.status["lastChecked"] = stamp
    patch.status["readyReplicas"] = int((found or {}).get("status", {}).get("readyReplicas") or 0)
    try:
        stats = await Connector(url, runtime.http, request_timeout_s=10).request(
            "GET", "/txn/v2/stats"
        )
    except (ServerError, Timeout) as e:
        patch.status["conditions"] = render.condition(
            conditions,
            kind="Reachable",
            status=False,
            reason=_reason(e),
            message=str(e),
            now=stamp,
        )
        return
    backlog = int(stats["gcBacklog"])
    threshold = int(spec.get("gcBacklogThreshold", 10_000))
    patch.status["openTransactions"] = int(stats["openTransactions"])
    patch.status["gcBacklog"] = backlog
    patch.status["idsHeld"] = list(stats["idsHeld"])
    conditions = render.condition(
        conditions, kind="Reachable", status=True, reason="StatsRead", message=url, now=stamp
    )
    high = backlog > threshold
    was_high = any(
        c.get("type") == "GCBacklogHigh" and c.get("status") == "True" for c in conditions
    )
    message = f"{backlog} op records await clean-up (threshold {threshold})"
    conditions = render.condition(
        conditions,
        kind="GCBacklogHigh",
        status=high,
        reason="AboveThreshold" if high else "BelowThreshold",
        message=message,
        now=stamp,
    )
    patch.status["conditions"] = conditions
    if high and not was_high:
        kopf.warn(body, reason="GCBacklogHigh", message=message)


# ---------------------------------------------------------------------- ScalableTopic


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
    namespace = _namespaced(namespace)
    runtime = _runtime(memo)
    topic = render.topic_of(spec)
    admin = await _admin(runtime, namespace, str(spec["clusterRef"]))
    target = spec.get("targetSegments")
    try:
        try:
            await admin.create_topic(topic, segments=int(spec.get("initialSegments", 1)))
            kopf.info(body, reason="Created", message=f"{topic} created")
        except ServerError as e:
            if e.name is not ErrorName.TOPIC_EXISTS:
                raise
        dag = await _converge(admin, topic, None if target is None else int(target), body)
    except (ServerError, Timeout) as e:
        # Why it is not ready shows in status; a refusal for good also as a Warning event.
        patch.status["conditions"] = render.condition(
            status.get("conditions"),
            kind="Ready",
            status=False,
            reason=_reason(e),
            message=str(e),
            now=_now(),
        )
        if not _transient(e):
            kopf.warn(body, reason="Refused", message=f"{topic}: {e}")
        raise _kopf_error(e, topic) from e
    patch.status.update(render.topic_status(dag, topic))
    patch.status["observedGeneration"] = body.meta.get("generation")
    active = int(patch.status["activeSegments"])
    patch.status["conditions"] = render.condition(
        status.get("conditions"),
        kind="Ready",
        status=True,
        reason="Converged" if target is None or active == int(target) else "AtLimit",
        message=f"{active} active segments",
        now=_now(),
    )


@kopf.on.delete(GROUP, VERSION, "scalabletopics")
async def delete_topic(
    *, body: kopf.Body, namespace: str | None, spec: kopf.Spec, memo: Any, **_: Any
) -> None:
    """Delete the topic, its segments and their data (unless ``deleteData`` is false)."""
    namespace = _namespaced(namespace)
    if not spec.get("deleteData", True):
        return
    runtime = _runtime(memo)
    topic = render.topic_of(spec)
    try:
        admin = await _admin(runtime, namespace, str(spec["clusterRef"]))
    except kopf.TemporaryError:
        kopf.warn(body, reason="ClusterGone", message=f"{topic}: its cluster is gone")
        return  # nothing left to delete the data from; do not hold the resource forever
    try:
        await admin.delete_topic(topic, force=True)
    except ServerError as e:
        if e.name is ErrorName.TOPIC_NOT_FOUND:
            return
        raise _kopf_error(e, f"deleting {topic}") from e
    except Timeout as e:
        raise _kopf_error(e, f"deleting {topic}") from e
    kopf.info(body, reason="Deleted", message=f"{topic} and its data deleted")
