"""The order of an upgrade: the brokers first, then the coordinators, one
TransactionCoordinator at a time.

A change of the SegtxnCluster's image, store or session TTL concerns both the brokers and
the coordinators of every TransactionCoordinator that refers to it (they take these from
the cluster). Applying both at once rolled them at the same time: coordinators of the new
version talking to brokers half of which run the old one. Instead:

1. The cluster's handler applies the brokers' children only; :mod:`.rolling` replaces the
   brokers one at a time.
2. Once the brokers run the spec (:func:`brokers_state`: the StatefulSet holds what the
   spec renders, its controller has seen it, every pod is updated and Ready), the
   cluster's status timer takes the coordinators (:func:`coordinators_step`), in name
   order: it applies one TransactionCoordinator's new children, then waits until its
   Deployment has rolled (:func:`.status.rollout` Ready) before it applies the next.
3. A Deployment replaces its coordinators one at a time, each new one Ready before an
   old one goes (``maxSurge: 1, maxUnavailable: 0``, :func:`.render.render_coordinator`),
   and a coordinator is Ready once it is registered in the store and campaigning for
   every coordinator id: when an old one stops it resigns its ids and the others, already
   campaigning, take them at once, so every id keeps an active coordinator throughout.

Where it stands is said in the cluster's condition ``Rolling`` (``TransactionCoordinator
<name> (k of n): ...``) and is read again from the live objects at each tick, so a
restarted operator goes on where it was: nothing of it is only in memory.

A TransactionCoordinator's own handler applies a change of its own spec at once, unless
it would change what its pods take from the cluster (image, configuration): that waits
(``Applied`` False, ``WaitingForRoll``) for the timer above to apply it in its turn, and
the handler, retried, then finds nothing left to change and says ``Applied``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import kopf

from segtxn.operator import immutable, render
from segtxn.operator.runtime import API, Runtime, apply_objects
from segtxn.operator.status import Rollout, rollout, template_key


async def brokers_state(
    runtime: Runtime, namespace: str, cluster: str, cluster_spec: Mapping[str, Any]
) -> Rollout:
    """Whether ``cluster``'s brokers run ``cluster_spec`` (``ready``), and if not why."""
    names = render.ClusterNames(cluster)
    live = await runtime.kube.get("apps/v1", "StatefulSet", namespace, names.brokers)
    return rollout(live, desired(render.render_cluster(cluster, namespace, cluster_spec)))


def desired(objects: Sequence[render.Obj]) -> render.Obj:
    """The workload (StatefulSet or Deployment) among rendered ``objects``."""
    return next(o for o in objects if o["kind"] in ("StatefulSet", "Deployment"))


def waits_for_brokers(live: Mapping[str, Any] | None, wanted: Mapping[str, Any]) -> bool:
    """Whether applying the coordinators' ``wanted`` Deployment over the ``live`` one
    would change what their pods take from the cluster (image, configuration hash): such
    a change waits for its turn, after the brokers. A Deployment that does not exist yet
    waits for nothing (there is nothing to roll)."""
    return live is not None and template_key(live) != template_key(wanted)


async def coordinators_step(
    runtime: Runtime,
    namespace: str,
    cluster: str,
    cluster_spec: Mapping[str, Any],
    coordinators: Sequence[str],
) -> tuple[str, str] | None:
    """One tick of the coordinators' turn, once the brokers run ``cluster_spec``: the
    first TransactionCoordinator (of ``coordinators``, by name) whose Deployment does not
    run the spec is applied, or waited for; (reason, message) for condition ``Rolling``,
    or None when every one runs it. A coordinator whose Deployment does not exist yet is
    its own handler's to create (skipped). An apply that fails is the reason
    ``ApplyFailed`` with the error, and is tried again at the next tick.

    Raises:
        KubeError, aiohttp.ClientError: reading failed (the timer's next tick retries).
    """
    ordered = sorted(coordinators)
    held: tuple[str, str] | None = None
    for k, name in enumerate(ordered, start=1):
        found = await runtime.kube.get(API, "TransactionCoordinator", namespace, name)
        if found is None or found.get("metadata", {}).get("deletionTimestamp"):
            continue
        owner = kopf.Body(cast(kopf.RawBody, found))
        objects = render.render_coordinator(name, namespace, owner.spec, cluster_spec)
        wanted = desired(objects)
        live = await runtime.kube.get(
            "apps/v1", "Deployment", namespace, wanted["metadata"]["name"]
        )
        state = rollout(live, wanted)
        which = f"TransactionCoordinator {name} ({k} of {len(ordered)})"
        if state.ready or state.reason == "Missing":
            continue
        if state.reason == "NotApplied":
            refused = immutable.coordinator_changes(live, owner.spec)
            if refused:  # its own handler refused the spec (ImmutableField): never applied
                held = held or (  # here, where the change would go through all the same
                    "Coordinators",
                    f"{which}: its spec changes {', '.join(c.field for c in refused)}, "
                    "refused (ImmutableField): it runs the spec it ran",
                )
                continue
            try:
                await apply_objects(runtime, owner, objects)
            except (kopf.TemporaryError, kopf.PermanentError) as e:
                # Said, and tried again at the next tick: an error raised from the timer
                # would stop it (PermanentError) or lose this tick's status.
                return "ApplyFailed", f"{which}: {e}"
            message = f"{len(objects)} objects re-rendered for SegtxnCluster {cluster}'s spec"
            kopf.info(owner, reason="Applied", message=message)
            return "Coordinators", (
                f"{which}: its new pod template applied; its Deployment replaces one "
                "coordinator at a time, each new one ready before an old one goes"
            )
        return "Coordinators", f"{which}: {state.message}"
    return held
