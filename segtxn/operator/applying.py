"""What the SegtxnCluster and TransactionCoordinator handlers share: applying a resource's
children and saying so in its status (``Applied`` True, an event), saying why a spec was
not applied (``Applied`` False, a Warning event once), each writer's conditions written
beside the other's (:func:`write_status`), and the check of a cluster's spec against
what its broker StatefulSet runs (:mod:`.immutable`)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import kopf

from segtxn.operator import render
from segtxn.operator.immutable import immutable_changes
from segtxn.operator.runtime import Runtime, apply_objects, now
from segtxn.operator.status import condition

HANDLER_CONDITIONS = ("Applied",)
"""The condition a SegtxnCluster's or TransactionCoordinator's handler owns; its status
timer owns the others."""


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
    applied = condition(
        status.get("conditions"),
        kind="Applied",
        status=True,
        reason="Rendered",
        message=message,
        now=now(),
        generation=body.meta.get("generation"),
    )
    write_status(
        patch,
        applied,
        own=HANDLER_CONDITIONS,
        fields={"observedGeneration": body.meta.get("generation")},
    )
    kopf.info(body, reason="Applied", message=message)


@dataclass(frozen=True)
class StatusWrite:
    """A Kopf patch function (one of ``patch.fns``): in the body it is given, sets the
    status ``fields`` (a None removes one, as in a merge patch) and the condition types
    ``own`` (to ``mine``), and leaves every other condition type as it is there.

    Why: a resource's handler (``Applied``) and its status timer (the other types) write
    one ``conditions`` list, and a merge patch replaces a list whole: each wrote the
    other's types back as it had last read them, which could undo a newer write. A timer
    tick that had read ``Applied`` False wrote it back over the handler's True, and nothing
    wrote True again: a cluster whose spec was applied said it was refused. Kopf runs a
    patch function on the freshest body it has (what the patch's merge part returned, else
    the last one watched) and sends the difference as one JSON patch that tests the
    resourceVersion: a write in between fails that test (422), and Kopf applies the
    function again on its next cycle, to the newer body. The fields ride in the same
    patch, so a reader never sees a timer's ``phase`` without its conditions."""

    fields: tuple[tuple[str, Any], ...]
    own: frozenset[str]
    mine: tuple[Mapping[str, Any], ...]

    def __call__(self, body: kopf.RawBody) -> None:
        status = body.setdefault("status", {})
        for key, value in self.fields:
            if value is None:  # as in a merge patch: gone
                status.pop(key, None)
            else:
                status[key] = copy.deepcopy(value)
        stored = status.get("conditions") or []
        others = [c for c in stored if c.get("type") not in self.own]
        mine = [dict(c) for c in self.mine]
        status["conditions"] = sorted([*others, *mine], key=lambda c: str(c["type"]))


def write_status(
    patch: kopf.Patch,
    conditions: Sequence[Mapping[str, Any]],
    *,
    own: Sequence[str],
    fields: Mapping[str, Any] | None = None,
) -> None:
    """Have ``patch`` write the condition types ``own`` as ``conditions`` has them (no
    other type) and the status ``fields``, together (:class:`StatusWrite`). It replaces an
    earlier such write of the same types still pending in ``patch`` (one that Kopf carried
    over from a write that met a newer version, on a handler's next run): its conditions
    are superseded, and its fields kept where this write does not set them (an
    ``observedGeneration`` whose children were applied stays written when the next run
    refuses a newer spec)."""
    types = frozenset(own)
    earlier: dict[str, Any] = {}
    for stale in forget_status_writes(patch, own):
        earlier.update(stale.fields)
    write = StatusWrite(
        tuple({**earlier, **(fields or {})}.items()),
        types,
        tuple(c for c in conditions if c.get("type") in types),
    )
    patch.fns.append(write)


def forget_status_writes(patch: kopf.Patch, own: Sequence[str]) -> list[StatusWrite]:
    """Take out of ``patch`` the writes of the condition types ``own`` still pending in it
    (carried over by Kopf from a write that met a newer version); returns them. A status
    timer calls it when its tick begins: the tick decides from the status as it is now,
    and one that finds nothing to change must not have an older tick's values written
    over it."""
    types = frozenset(own)
    stale = [fn for fn in patch.fns if isinstance(fn, StatusWrite) and fn.own == types]
    for fn in stale:
        patch.fns.remove(fn)
    return stale


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
    refused = condition(
        previous,
        kind="Applied",
        status=False,
        reason=why,
        message=message,
        now=now(),
        generation=body.meta.get("generation"),
    )
    write_status(patch, refused, own=HANDLER_CONDITIONS)
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
