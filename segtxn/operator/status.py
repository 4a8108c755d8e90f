"""Status that tells the truth: Kubernetes-style conditions, and whether what runs is what
the spec asks for.

A condition says what held when it was written (``observedGeneration``: the resource's
generation it was computed for) and since when (``lastTransitionTime`` moves only when
``status`` flips, Kubernetes' convention, so "Ready for three days" stays readable across
the timers that rewrite it).

:func:`rollout` is why ``Ready`` is not "enough pods answer their probes": a StatefulSet
or Deployment is running the spec only once it holds what the operator rendered (replicas,
image, configuration hash), its controller has seen that change (``observedGeneration``
reached ``generation``) and every desired pod is updated and ready. Anything less is a
rollout in progress, a change not applied (refused, or failed), or a degraded workload,
and the reason says which.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from segtxn.operator.render import CONFIG_HASH

Obj = dict[str, Any]

STATUS_TICK_S = 1.0
"""How often status timers wake; each resource's own interval decides when they read."""


def condition(
    previous: Sequence[Mapping[str, Any]] | None,
    *,
    kind: str,
    status: bool,
    reason: str,
    message: str,
    now: str,
    generation: int | None,
) -> list[Obj]:
    """``previous`` conditions with ``kind`` set for the resource's ``generation``; its
    lastTransitionTime moves only when its status changes."""
    value = "True" if status else "False"
    kept = [dict(c) for c in previous or () if c.get("type") != kind]
    old = next((c for c in previous or () if c.get("type") == kind), None)
    since = old["lastTransitionTime"] if old and old.get("status") == value else now
    new: Obj = {
        "type": kind,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
    }
    if generation is not None:
        new["observedGeneration"] = int(generation)
    return sorted([*kept, new], key=lambda c: str(c["type"]))


def same(previous: Sequence[Mapping[str, Any]] | None, wanted: Sequence[Mapping[str, Any]]) -> bool:
    """Whether writing ``wanted`` would change nothing (a timer then writes nothing)."""
    return [dict(c) for c in previous or ()] == [dict(c) for c in wanted]


@dataclass(frozen=True)
class Rollout:
    """Where a workload stands against what was rendered for the spec."""

    ready: bool
    reason: str
    """``Ready``, ``Missing``, ``NotApplied``, ``RollingOut`` or ``NotReady``."""
    message: str
    ready_replicas: int


def template_key(workload: Mapping[str, Any]) -> tuple[list[str], str | None]:
    """(images, configuration hash) of a workload's pod template: what the spec decides
    of its pods beyond the replica count."""
    template = workload.get("spec", {}).get("template", {})
    images = [str(c.get("image")) for c in template.get("spec", {}).get("containers", [])]
    annotations = template.get("metadata", {}).get("annotations") or {}
    return images, annotations.get(CONFIG_HASH)


def rollout(live: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> Rollout:
    """Compare the ``live`` StatefulSet or Deployment with the ``desired`` one (as
    rendered from the spec)."""
    kind, name = desired["kind"], desired["metadata"]["name"]
    wanted = int(desired["spec"]["replicas"])
    if live is None:
        return Rollout(False, "Missing", f"{kind} {name} does not exist (yet)", 0)
    status = live.get("status") or {}
    ready = int(status.get("readyReplicas") or 0)
    has = int(live.get("spec", {}).get("replicas", 1))
    images, config = template_key(live)
    want_images, want_config = template_key(desired)
    if has != wanted or images != want_images or config != want_config:
        return Rollout(
            False,
            "NotApplied",
            f"{kind} {name} holds {has} replicas of {', '.join(images)} (configuration "
            f"{config}); the spec asks for {wanted} of {', '.join(want_images)} "
            f"(configuration {want_config}): see condition Applied",
            ready,
        )
    generation = live.get("metadata", {}).get("generation")
    observed = status.get("observedGeneration")
    if generation is None or observed is None or int(observed) < int(generation):
        return Rollout(
            False,
            "RollingOut",
            f"{kind} {name}: its controller has not acted on generation {generation} yet "
            f"(observed {observed})",
            ready,
        )
    updated = int(status.get("updatedReplicas") or 0)
    total = int(status.get("replicas") or 0)
    if updated < wanted or total > wanted:
        return Rollout(
            False,
            "RollingOut",
            f"{kind} {name}: {updated}/{wanted} pods updated, {total} running, {ready} ready",
            ready,
        )
    if ready < wanted:
        return Rollout(False, "NotReady", f"{kind} {name}: {ready}/{wanted} pods ready", ready)
    return Rollout(True, "Ready", f"{kind} {name}: {ready}/{wanted} pods ready, up to date", ready)
