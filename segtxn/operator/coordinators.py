"""Kopf handlers of TransactionCoordinator: its children applied (its cluster must exist
and the cluster's spec be accepted: a coordinator's children are rendered from both); a timer
reads ``Ready`` as for a cluster, and ``/txn/v2/stats`` into status, and raises
``GCBacklogHigh`` above the threshold.
"""

from __future__ import annotations

import datetime
from typing import Any

import kopf

from segtxn.client.connection import Connector
from segtxn.client.errors import Timeout
from segtxn.operator import credentials, ordering, render
from segtxn.operator.applying import (
    apply_children,
    forget_status_writes,
    not_applied,
    refused_changes,
    write_status,
)
from segtxn.operator.immutable import coordinator_changes
from segtxn.operator.runtime import (
    API,
    GROUP,
    RETRY_S,
    VERSION,
    cluster_spec,
    namespaced,
    now,
    reason,
    runtime_of,
    serving,
    snapshot,
    track,
)
from segtxn.operator.status import STATUS_TICK_S, Rollout, condition, rollout
from segtxn.protocol.errors import ServerError


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
        not_applied(body, status, patch, "ImmutableField", changes)
        raise kopf.PermanentError(changes)
    try:
        cluster = await cluster_spec(runtime, namespace, cluster_name)
        refused = await refused_changes(runtime, namespace, cluster_name, cluster)
        if refused is None:
            await credentials.ensure_coordinator(runtime, body, cluster_name, cluster)
    except kopf.TemporaryError as e:
        not_applied(body, status, patch, "WaitingForCluster", str(e))
        raise
    if refused is not None:
        message = f"SegtxnCluster {cluster_name}'s spec is refused: {refused}"
        not_applied(body, status, patch, "WaitingForCluster", message)
        raise kopf.TemporaryError(message, delay=RETRY_S * 6)
    objects = render.render_coordinator(name, namespace, spec, cluster)
    wanted = ordering.desired(objects)
    if ordering.waits_for_brokers(live, wanted):
        message = (
            f"it changes what the coordinators take from SegtxnCluster {cluster_name}: "
            "applied in its turn by the cluster's roll (the brokers first, then the "
            "coordinators, one TransactionCoordinator at a time)"
        )
        not_applied(body, status, patch, "WaitingForRoll", message)
        raise kopf.TemporaryError(message, delay=RETRY_S * 2)
    try:
        await apply_children(runtime, body, status, patch, objects)
    except (kopf.TemporaryError, kopf.PermanentError) as e:
        not_applied(body, status, patch, "ApplyFailed", str(e))
        raise


TIMER_CONDITIONS = ("Ready", "Reachable", "GCBacklogHigh")
"""The conditions the coordinator's status timer owns; ``Applied`` is the handler's."""


@kopf.timer(GROUP, VERSION, "transactioncoordinators", interval=STATUS_TICK_S, when=serving)
async def coordinator_status(
    *,
    body: kopf.Body,
    name: str,
    namespace: str | None,
    spec: kopf.Spec,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: Any,
    **kwargs: Any,
) -> None:
    """Every ``statusIntervalSeconds``: ``Ready`` from the Deployment against what the
    spec and its cluster's render (:func:`status.rollout`); open transactions and the GC
    backlog into status; ``GCBacklogHigh`` when the backlog passes ``gcBacklogThreshold``."""
    forget_status_writes(patch, TIMER_CONDITIONS)  # this tick decides afresh
    if track(memo, kwargs["stopped"]):  # Kopf's TimerFn type leaves this kwarg out
        return
    body = snapshot(body)  # one spec and one status for the whole tick
    spec, status = body.spec, body.status
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
    fields: dict[str, Any] = {"lastChecked": stamp, "readyReplicas": state.ready_replicas}
    try:
        http = await runtime.sessions.session(
            runtime.kube, runtime.http, namespace, cluster_name, secured
        )
        stats = await Connector(url, http, request_timeout_s=10).request("GET", "/txn/v2/stats")
    except (ServerError, Timeout) as e:
        conditions = condition(
            conditions,
            kind="Reachable",
            status=False,
            reason=reason(e),
            message=str(e),
            now=stamp,
            generation=generation,
        )
        write_status(patch, conditions, own=TIMER_CONDITIONS, fields=fields)
        return
    backlog = int(stats["gcBacklog"])
    threshold = int(spec.get("gcBacklogThreshold", 10_000))
    fields["openTransactions"] = int(stats["openTransactions"])
    fields["gcBacklog"] = backlog
    fields["idsHeld"] = list(stats["idsHeld"])
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
    write_status(patch, conditions, own=TIMER_CONDITIONS, fields=fields)
    if high and not was_high:
        kopf.warn(body, reason="GCBacklogHigh", message=message)
