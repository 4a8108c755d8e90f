"""What the SegtxnCluster and TransactionCoordinator handlers share: applying a resource's
children and saying so in its status (``Applied`` True, an event), saying why a spec was
not applied (``Applied`` False, a Warning event once), a status timer's conditions written
beside the handler's (:func:`with_fresh_others`), and the check of a cluster's spec against
what its broker StatefulSet runs (:mod:`.immutable`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import kopf

from segtxn.operator import render
from segtxn.operator.immutable import immutable_changes
from segtxn.operator.runtime import API, Runtime, apply_objects, now
from segtxn.operator.status import condition


async def apply_children(
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


async def with_fresh_others(
    runtime: Runtime,
    kind: str,
    namespace: str,
    name: str,
    conditions: list[dict[str, Any]],
    *,
    own: Sequence[str],
) -> list[dict[str, Any]]:
    """What a status timer writes as ``conditions``: its ``own`` types from ``conditions``,
    the others (``Applied``: the handler's) as stored now, re-read.

    Why: the tick began with a snapshot (:func:`.runtime.snapshot`), and the handler may
    have written ``Applied`` since; a merge patch replaces the whole list, so writing the
    snapshot's would undo it. What remains is a window of one request between this read
    and the timer's write."""
    fresh = await runtime.kube.get(API, kind, namespace, name)
    stored = ((fresh or {}).get("status") or {}).get("conditions") or []
    others = [c for c in stored if c.get("type") not in own]
    mine = [c for c in conditions if c.get("type") in own]
    return sorted([*others, *mine], key=lambda c: str(c["type"]))


def not_applied(
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


async def refused_changes(
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
