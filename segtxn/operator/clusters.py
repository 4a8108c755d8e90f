"""Kopf handlers of SegtxnCluster: the safety checks (:mod:`.immutable`,
:mod:`.scaledown`) first, then its children applied (:mod:`.applying`); a timer rolls the
brokers (:mod:`.rolling`), then its coordinators (:mod:`.ordering`), and compares the broker
StatefulSet with the spec (:func:`.status.rollout`) into ``Ready``; deletion waits until no
ScalableTopic or TransactionCoordinator refers to it. TransactionCoordinators:
:mod:`.coordinators`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import kopf

from segtxn.ledger.replicas import Replication
from segtxn.operator import credentials, ordering, render, replication, rolling, scaledown, security
from segtxn.operator.applying import (
    apply_children,
    forget_status_writes,
    not_applied,
    refused_changes,
    write_status,
)
from segtxn.operator.runtime import (
    GROUP,
    RETRY_S,
    VERSION,
    admin,
    namespaced,
    now,
    runtime_of,
    serving,
    snapshot,
    track,
)
from segtxn.operator.security import InvalidSecurity
from segtxn.operator.status import STATUS_TICK_S, Rollout, condition, rollout, same

SCALE_DOWN_RECHECK_S = 30.0
"""How often a refused scale-down is checked again."""


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
    refused = await refused_changes(runtime, namespace, name, spec)
    if refused is not None:
        not_applied(body, status, patch, "ImmutableField", refused)
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
            not_applied(body, status, patch, "ScaleDownRefused", verdict.message)
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
        await apply_children(
            runtime, body, status, patch, render.render_cluster(name, namespace, spec)
        )
    except InvalidSecurity as e:
        not_applied(body, status, patch, "InvalidSecurity", str(e))
        raise kopf.PermanentError(str(e)) from e
    except (kopf.TemporaryError, kopf.PermanentError) as e:
        not_applied(body, status, patch, "ApplyFailed", str(e))
        raise
    patch.status["serviceUrl"] = render.service_url(name, namespace, spec)
    if _pending_unless_phased not in patch.fns:  # (one carried over may be there)
        patch.fns.append(_pending_unless_phased)


def _pending_unless_phased(body: kopf.RawBody) -> None:
    """A Kopf patch function: phase ``Pending`` for a cluster that has no phase yet. The
    status timer's phase stays, even one written after the handler's body was read
    (:class:`~.applying.StatusWrite` says why a function and not a merge patch)."""
    body.setdefault("status", {}).setdefault("phase", "Pending")


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
        not_applied(body, status, patch, "InvalidReplication", str(e))
        raise kopf.PermanentError(str(e)) from e


def _security(
    body: kopf.Body, status: kopf.Status, patch: kopf.Patch, spec: Mapping[str, Any]
) -> None:
    """:func:`.security.check`, switch on or off, before anything is applied or scaled down
    (with security on, the grants too: checked only when the policy was rendered, a refused
    spec had drained the brokers a scale-down let go).

    Raises:
        kopf.PermanentError: it refused the spec (``Applied`` False, ``InvalidSecurity``);
            only a new spec heals it.
    """
    try:
        security.check(spec)
    except InvalidSecurity as e:
        not_applied(body, status, patch, "InvalidSecurity", str(e))
        raise kopf.PermanentError(str(e)) from e


@kopf.timer(GROUP, VERSION, "segtxnclusters", interval=STATUS_TICK_S, when=serving)
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
    forget_status_writes(patch, TIMER_CONDITIONS)  # this tick decides afresh
    if track(memo, indexes["stopped"]):  # Kopf's TimerFn type leaves this kwarg out
        return
    body = snapshot(body)  # the spec the brokers are checked against is the one applied
    spec, status = body.spec, body.status
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
    fields = {"roll": roll, "readyBrokers": state.ready_replicas, "phase": phase}
    write_status(patch, conditions, own=TIMER_CONDITIONS, fields=fields)
    was_ready = status.get("phase") == "Ready"
    if state.ready and not was_ready:
        kopf.info(body, reason="Ready", message=state.message)


TIMER_CONDITIONS = ("Ready", "Rolling", "Degraded")
"""The conditions the cluster's status timer owns; ``Applied`` is the handler's."""


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
