"""Kopf handlers of SegtxnCluster and TransactionCoordinator: their children applied,
their status read.

- SegtxnCluster: on create/update/resume, the safety checks (:mod:`.immutable`,
  :mod:`.scaledown`) first, then its children applied; a timer rolls the brokers
  (:mod:`.rolling`), then its coordinators (:mod:`.ordering`), and compares the broker
  StatefulSet with the spec (:func:`.status.rollout`) into ``Ready``; deletion waits
  until no ScalableTopic or TransactionCoordinator refers to it.
- TransactionCoordinator: children applied (the cluster must exist and its spec be
  accepted); a timer reads ``Ready`` the same way and ``/txn/v2/stats`` into status, and
  raises ``GCBacklogHigh`` above the threshold.

The two live in one module because a coordinator's children are rendered from its
cluster's spec too (image, store, session TTL).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from segtxn.client.connection import Connector
from segtxn.client.errors import Timeout
from segtxn.ledger.replicas import Replication
from segtxn.operator import (
    credentials,
    ordering,
    render,
    replication,
    rolling,
    scaledown,
    security,
)
from segtxn.operator.immutable import coordinator_changes, immutable_changes
from segtxn.operator.runtime import (
    API,
    GROUP,
    RETRY_S,
    VERSION,
    Runtime,
    admin,
    apply_objects,
    cluster_spec,
    namespaced,
    now,
    reason,
    runtime_of,
)
from segtxn.operator.security import InvalidSecurity
from segtxn.operator.status import Rollout, condition, rollout, same
from segtxn.protocol.errors import ServerError

STATUS_TICK_S = 1.0
"""How often status timers wake; each resource's own interval decides when they read."""
SCALE_DOWN_RECHECK_S = 30.0
"""How often a refused scale-down is checked again."""


async def _apply(
    runtime: Runtime,
    body: kopf.Body,
    status: kopf.Status,
    patch: kopf.Patch,
    objects: list[render.Obj],
) -> None:
    """Create or update the resource's children (owned by it), then say so: status
    (``observedGeneration``, condition ``Applied``) and an event."""
    await apply_objects(runtime, body, objects)
    message = f"{len(objects)} objects applied"
    patch.status["observedGeneration"] = body.meta.get("generation")
    patch.status["conditions"] = condition(
        status.get("conditions"),
        kind="Applied",
        status=True,
        reason="Rendered",
        message=message,
        now=now(),
        generation=body.meta.get("generation"),
    )
    kopf.info(body, reason="Applied", message=message)


def _not_applied(
    body: kopf.Body, status: kopf.Status, patch: kopf.Patch, why: str, message: str
) -> None:
    """Say that the spec was not applied, and why: ``Applied`` False with reason ``why``
    (a safety check's refusal, or a failure), and a Warning event unless the status says
    the same already (a check retried every half minute would repeat its event)."""
    previous = status.get("conditions")
    repeated = any(
        c.get("type") == "Applied"
        and c.get("status") == "False"
        and c.get("reason") == why
        and c.get("message") == message
        for c in previous or ()
    )
    patch.status["conditions"] = condition(
        previous,
        kind="Applied",
        status=False,
        reason=why,
        message=message,
        now=now(),
        generation=body.meta.get("generation"),
    )
    if not repeated:
        kopf.warn(body, reason=why, message=message)


async def _immutable_changes(
    runtime: Runtime, namespace: str, cluster: str, spec: Mapping[str, Any]
) -> str | None:
    """Why ``spec`` of SegtxnCluster ``cluster`` may not be applied (it changes a field
    that is fixed once applied), or None. What is applied is what the live broker
    StatefulSet runs: its volume claims, and the ConfigMap its pods read (a newer one
    whose StatefulSet apply failed was never in use)."""
    names = render.ClusterNames(cluster)
    brokers = await runtime.kube.get("apps/v1", "StatefulSet", namespace, names.brokers)
    used = render.config_ref(brokers)
    config = None if used is None else await runtime.kube.get("v1", "ConfigMap", namespace, used)
    changes = immutable_changes(None if config is None else config.get("data", {}), brokers, spec)
    return "; ".join(c.message() for c in changes) or None


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
    **indexes: Any,
) -> None:
    """Apply the cluster's children; its coordinators' children follow once the brokers
    run the spec (:mod:`.ordering`: their image, store and session TTL are the cluster's,
    and the brokers roll first). One spec change reaches every pod.

    A spec the safety checks refuse is refused whole, before anything is applied
    (condition ``Applied`` False, a Warning event, the reason naming the check):
    ``ImmutableField`` (:mod:`.immutable`; replication turned off included) and
    ``InvalidReplication`` (:mod:`.replication`: not a ``W/A`` the brokers accept, or
    ``W`` above the broker count) and ``InvalidSecurity`` (:mod:`.security`: a role name
    that cannot name its Secret, a policy the servers would refuse), not retried, only a
    new spec heals them;
    ``ScaleDownRefused`` (:mod:`.scaledown`), checked again every
    :data:`SCALE_DOWN_RECHECK_S` (the brokers' topics may be deleted meanwhile), except
    below replication's ``W``, which is final. With replication the brokers that would go
    are drained first (their topics move to the others), and the replicas they keep go
    with them (a ``ReplicasLost`` Warning event says so)."""
    namespace = namespaced(namespace)
    runtime = runtime_of(memo)
    names = render.ClusterNames(name)
    refused = await _immutable_changes(runtime, namespace, name, spec)
    if refused is not None:
        _not_applied(body, status, patch, "ImmutableField", refused)
        raise kopf.PermanentError(refused)
    quorums = _replication(body, status, patch, replication.parse, spec)
    _security(body, status, patch, spec)
    live = await runtime.kube.get("apps/v1", "StatefulSet", namespace, names.brokers)
    current = None if live is None else int(live.get("spec", {}).get("replicas", 0))
    wanted = int(spec.get("brokers", {}).get("replicas", 3))
    if current is not None and wanted < current:
        brokers = await admin(runtime, namespace, name, spec)
        verdict = await scaledown.check(
            brokers,
            names.brokers,
            current,
            wanted,
            replication=quorums,
            drain_timeout_s=runtime.config.roll.drain_timeout_s,
        )
        if not verdict.allowed:
            _not_applied(body, status, patch, "ScaleDownRefused", verdict.message)
            if verdict.final:
                raise kopf.PermanentError(verdict.message)
            raise kopf.TemporaryError(verdict.message, delay=SCALE_DOWN_RECHECK_S)
        kopf.info(body, reason="ScaleDown", message=verdict.message)
        if verdict.lost:
            kopf.warn(body, reason="ReplicasLost", message=verdict.lost)
    _replication(body, status, patch, replication.wanted, spec)
    try:  # the Secrets a secured cluster's pods mount first (:mod:`.credentials`)
        coordinators = indexes["coordinators_by_cluster"].get((namespace, name), [])
        await credentials.ensure_cluster(runtime, body, spec, coordinators)
        await _apply(runtime, body, status, patch, render.render_cluster(name, namespace, spec))
    except InvalidSecurity as e:
        _not_applied(body, status, patch, "InvalidSecurity", str(e))
        raise kopf.PermanentError(str(e)) from e
    except (kopf.TemporaryError, kopf.PermanentError) as e:
        _not_applied(body, status, patch, "ApplyFailed", str(e))
        raise
    patch.status["serviceUrl"] = render.service_url(name, namespace, spec)
    patch.status["phase"] = status.get("phase") or "Pending"


def _replication(
    body: kopf.Body,
    status: kopf.Status,
    patch: kopf.Patch,
    check: Callable[[Mapping[str, Any]], Replication | None],
    spec: Mapping[str, Any],
) -> Replication | None:
    """``check(spec)`` (:func:`.replication.parse` or :func:`.replication.wanted`).

    Raises:
        kopf.PermanentError: the check refused it (``Applied`` False,
            ``InvalidReplication``); only a new spec heals it.
    """
    try:
        return check(spec)
    except replication.InvalidReplication as e:
        _not_applied(body, status, patch, "InvalidReplication", str(e))
        raise kopf.PermanentError(str(e)) from e


def _security(
    body: kopf.Body, status: kopf.Status, patch: kopf.Patch, spec: Mapping[str, Any]
) -> None:
    """:func:`.security.check`, switch on or off, before anything is applied or scaled down
    (the grants are checked later, when the policy is rendered).

    Raises:
        kopf.PermanentError: it refused the spec (``Applied`` False, ``InvalidSecurity``);
            only a new spec heals it.
    """
    try:
        security.check(spec)
    except InvalidSecurity as e:
        _not_applied(body, status, patch, "InvalidSecurity", str(e))
        raise kopf.PermanentError(str(e)) from e


@kopf.timer(GROUP, VERSION, "segtxnclusters", interval=STATUS_TICK_S)
async def cluster_readiness(
    *,
    name: str,
    namespace: str | None,
    spec: kopf.Spec,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: Any,
    body: kopf.Body,
    **indexes: Any,
) -> None:
    """Every second: one step of the brokers' roll (:mod:`.rolling`: ``status.roll``,
    conditions ``Rolling`` and, stalled, ``Degraded``), and condition ``Ready`` (and
    ``phase``, ``readyBrokers``) from the broker StatefulSet against what the spec renders
    (:func:`status.rollout`); once the brokers run the spec, one step of the coordinators'
    turn (:mod:`.ordering`, said in ``Rolling``); written only when something changed. One
    timer writes them all: two would each rewrite the whole ``conditions`` list from what
    they last read."""
    namespace = namespaced(namespace)
    runtime = runtime_of(memo)
    names = render.ClusterNames(name)
    found = await runtime.kube.get("apps/v1", "StatefulSet", namespace, names.brokers)
    desired = next(
        o for o in render.render_cluster(name, namespace, spec) if o["kind"] == "StatefulSet"
    )
    state = rollout(found, desired)
    phase = _phase(state)
    if body.meta.get("deletionTimestamp"):
        phase = "Deleting"
    conditions = condition(
        status.get("conditions"),
        kind="Ready",
        status=state.ready,
        reason=state.reason,
        message=state.message,
        now=now(),
        generation=body.meta.get("generation"),
    )
    roll = status.get("roll")
    if found is not None and not body.meta.get("deletionTimestamp"):
        brokers_api = await admin(runtime, namespace, name, spec)
        conditions, roll = await rolling.step(
            body,
            kube=runtime.kube,
            admin=brokers_api,
            settings=runtime.config.roll,
            brokers=found,
            previous=roll,
            conditions=conditions,
        )
        applied = status.get("observedGeneration") == body.meta.get("generation")
        if state.ready and roll is None and applied:
            coordinators = indexes["coordinators_by_cluster"].get((namespace, name), [])
            turn = await ordering.coordinators_step(runtime, namespace, name, spec, coordinators)
            if turn is not None:
                conditions = _rolling(status, conditions, turn, body.meta.get("generation"))
    unchanged = status.get("readyBrokers") == state.ready_replicas and status.get("phase") == phase
    if unchanged and status.get("roll") == roll and same(status.get("conditions"), conditions):
        return
    patch.status["roll"] = roll
    patch.status["readyBrokers"] = state.ready_replicas
    patch.status["phase"] = phase
    patch.status["conditions"] = await _with_fresh_others(runtime, namespace, name, conditions)
    was_ready = status.get("phase") == "Ready"
    if state.ready and not was_ready:
        kopf.info(body, reason="Ready", message=state.message)


TIMER_CONDITIONS = ("Ready", "Rolling", "Degraded")
"""The conditions the cluster's status timer owns; ``Applied`` is the handler's."""


async def _with_fresh_others(
    runtime: Runtime, namespace: str, name: str, conditions: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The timer's own ``conditions`` with the others as stored now, re-read: the tick
    began with a snapshot, and the handler may have written ``Applied`` since (a merge
    patch replaces the whole list, so writing the snapshot's would undo it). What remains
    is a window of one request between this read and the timer's write."""
    fresh = await runtime.kube.get(API, "SegtxnCluster", namespace, name)
    stored = ((fresh or {}).get("status") or {}).get("conditions") or []
    others = [c for c in stored if c.get("type") not in TIMER_CONDITIONS]
    own = [c for c in conditions if c.get("type") in TIMER_CONDITIONS]
    return sorted([*others, *own], key=lambda c: str(c["type"]))


def _rolling(
    status: kopf.Status,
    conditions: list[dict[str, Any]],
    turn: tuple[str, str],
    generation: int | None,
) -> list[dict[str, Any]]:
    """``conditions`` with ``Rolling`` True for the coordinators' ``turn``; its
    lastTransitionTime from what status holds (the brokers' tick may have set it False)."""
    before = [c for c in status.get("conditions") or () if c.get("type") == "Rolling"]
    reason, message = turn
    rolling = condition(before, kind="Rolling", status=True, reason=reason, message=message,
                        now=now(), generation=generation)  # fmt: skip
    others = [c for c in conditions if c.get("type") != "Rolling"]
    return sorted([*others, *rolling], key=lambda c: str(c["type"]))


def _phase(state: Rollout) -> str:
    """The one-word summary of a rollout (the CRD's ``phase``)."""
    if state.ready:
        return "Ready"
    if state.reason in ("NotApplied", "RollingOut"):
        return "Updating"
    return "Degraded" if state.ready_replicas else "Pending"


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
    namespace = namespaced(namespace)
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
    """Apply the coordinators' children, rendered from this spec and its cluster's. While
    the cluster's own spec is refused (:mod:`.immutable`), wait: rendering from it would
    half-apply what the cluster's handler refused. A change of what the pods take from the
    cluster (image, configuration) is not applied here: the cluster's roll applies it in
    its turn (:mod:`.ordering`: the brokers first, then one TransactionCoordinator at a
    time); meanwhile ``Applied`` is False, ``WaitingForRoll``. A change of
    ``coordinatorIds`` or ``clusterRef`` against the live Deployment is refused whole
    (:func:`.immutable.coordinator_changes`: ``Applied`` False, ``ImmutableField``), before
    anything is written."""
    namespace = namespaced(namespace)
    runtime = runtime_of(memo)
    cluster_name = str(spec["clusterRef"])
    full = render.coordinator_name(name)
    live = await runtime.kube.get("apps/v1", "Deployment", namespace, full)
    changes = "; ".join(c.message() for c in coordinator_changes(live, spec))
    if changes:
        _not_applied(body, status, patch, "ImmutableField", changes)
        raise kopf.PermanentError(changes)
    try:
        cluster = await cluster_spec(runtime, namespace, cluster_name)
        refused = await _immutable_changes(runtime, namespace, cluster_name, cluster)
        if refused is None:
            await credentials.ensure_coordinator(runtime, body, cluster_name, cluster)
    except kopf.TemporaryError as e:
        _not_applied(body, status, patch, "WaitingForCluster", str(e))
        raise
    if refused is not None:
        message = f"SegtxnCluster {cluster_name}'s spec is refused: {refused}"
        _not_applied(body, status, patch, "WaitingForCluster", message)
        raise kopf.TemporaryError(message, delay=RETRY_S * 6)
    objects = render.render_coordinator(name, namespace, spec, cluster)
    wanted = ordering.desired(objects)
    if ordering.waits_for_brokers(live, wanted):
        message = (
            f"it changes what the coordinators take from SegtxnCluster {cluster_name}: "
            "applied in its turn by the cluster's roll (the brokers first, then the "
            "coordinators, one TransactionCoordinator at a time)"
        )
        _not_applied(body, status, patch, "WaitingForRoll", message)
        raise kopf.TemporaryError(message, delay=RETRY_S * 2)
    try:
        await _apply(runtime, body, status, patch, objects)
    except (kopf.TemporaryError, kopf.PermanentError) as e:
        _not_applied(body, status, patch, "ApplyFailed", str(e))
        raise


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
    """Every ``statusIntervalSeconds``: ``Ready`` from the Deployment against what the
    spec and its cluster's render (:func:`status.rollout`); open transactions and the GC
    backlog into status; ``GCBacklogHigh`` when the backlog passes ``gcBacklogThreshold``."""
    namespace = namespaced(namespace)
    last = status.get("lastChecked")
    interval = float(spec.get("statusIntervalSeconds", 30))
    current = datetime.datetime.now(datetime.UTC)
    if last and (current - datetime.datetime.fromisoformat(last)).total_seconds() < interval:
        return
    runtime = runtime_of(memo)
    found = await runtime.kube.get(
        "apps/v1", "Deployment", namespace, render.coordinator_name(name)
    )
    cluster_name = str(spec["clusterRef"])
    cluster = await runtime.kube.get(API, "SegtxnCluster", namespace, cluster_name)
    secured = dict((cluster or {}).get("spec", {}))
    url = runtime.config.coordinator_url or render.coordinator_url(name, namespace, spec, secured)
    ready = int((found or {}).get("status", {}).get("readyReplicas") or 0)
    if cluster is None:
        state = Rollout(False, "Missing", f"SegtxnCluster {cluster_name} does not exist", ready)
    else:
        rendered = render.render_coordinator(name, namespace, spec, cluster.get("spec", {}))
        state = rollout(found, next(o for o in rendered if o["kind"] == "Deployment"))
    stamp = now()
    generation = body.meta.get("generation")
    conditions = condition(
        status.get("conditions"),
        kind="Ready",
        status=state.ready,
        reason=state.reason,
        message=state.message,
        now=stamp,
        generation=generation,
    )
    patch.status["lastChecked"] = stamp
    patch.status["readyReplicas"] = state.ready_replicas
    try:
        http = await runtime.sessions.session(
            runtime.kube, runtime.http, namespace, cluster_name, secured
        )
        stats = await Connector(url, http, request_timeout_s=10).request("GET", "/txn/v2/stats")
    except (ServerError, Timeout) as e:
        patch.status["conditions"] = condition(
            conditions,
            kind="Reachable",
            status=False,
            reason=reason(e),
            message=str(e),
            now=stamp,
            generation=generation,
        )
        return
    backlog = int(stats["gcBacklog"])
    threshold = int(spec.get("gcBacklogThreshold", 10_000))
    patch.status["openTransactions"] = int(stats["openTransactions"])
    patch.status["gcBacklog"] = backlog
    patch.status["idsHeld"] = list(stats["idsHeld"])
    conditions = condition(
        conditions,
        kind="Reachable",
        status=True,
        reason="StatsRead",
        message=url,
        now=stamp,
        generation=body.meta.get("generation"),
    )
    high = backlog > threshold
    was_high = any(
        c.get("type") == "GCBacklogHigh" and c.get("status") == "True" for c in conditions
    )
    message = f"{backlog} op records await clean-up (threshold {threshold})"
    conditions = condition(
        conditions,
        kind="GCBacklogHigh",
        status=high,
        reason="AboveThreshold" if high else "BelowThreshold",
        message=message,
        now=stamp,
        generation=body.meta.get("generation"),
    )
    patch.status["conditions"] = conditions
    if high and not was_high:
        kopf.warn(body, reason="GCBacklogHigh", message=message)
