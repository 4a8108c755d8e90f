"""Server-side apply, as the emulator (:mod:`tests.operator.emulator`) does it.

kmock 0.8 merges every PATCH body into the stored object whatever its Content-Type: a
JSON merge patch, so a field left out of the body stays. A real API server treats
``application/apply-patch+yaml`` differently: the body is the *whole* configuration its
field manager wants; fields that manager applied before and no longer sends are removed,
fields other managers own stay, and the object is created when absent. The operator relies
on exactly that (``segtxn.operator.kube.Kube.apply``), so the emulator must do it too, or a
test of "a dropped field disappears" would prove nothing.

What is emulated, and what is simpler than Kubernetes:

- Ownership is recorded where a real API server keeps it, in ``metadata.managedFields``
  (``operation: Apply``, ``fieldsType: FieldsV1``, ``f:``-prefixed keys), one entry per
  applying manager.
- Lists are atomic: a list is one field, owned and replaced whole. Kubernetes merges
  associative lists (containers by name, tolerations, env) item by item; for one manager
  that applies the whole list every time, as the operator does, the outcome is the same.
- Only appliers own fields. A real API server also records ``Update`` managers (whoever
  POSTed or merge-patched a field), and an applier then shares the field with them: a
  field created by a plain POST and later dropped from an apply stays. Here it goes. The
  tests do not depend on the difference (the operator only applies).
- ``force`` is assumed: a field another applier owns is taken over, never a 409 conflict.
  The operator always applies with ``force=true``; conflicts are not emulated.
- ``status`` and the server's own metadata (uid, resourceVersion, generation, ...) are
  never owned: an apply neither sets nor removes them (as for resources whose status is a
  subresource).
- ``metadata.generation`` of an object with a ``spec`` is the API server's
  (:func:`with_generation`): 1 when an apply creates it, one more in the same write when an
  apply changes its spec. A workload's controller compares it with its
  ``status.observedGeneration``; a test that bumped it itself, after the apply, would leave
  a window in which the new template looks rolled out already.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

Obj = dict[str, Any]
Path = tuple[str, ...]

APPLY_PATCH = "application/apply-patch+yaml"
SERVER_METADATA = frozenset(
    {"uid", "resourceVersion", "creationTimestamp", "generation", "managedFields",
     "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"}
)  # fmt: skip


def leaves(obj: Mapping[str, Any], prefix: Path = ()) -> set[Path]:
    """The field paths ``obj`` sets: every non-map value (lists whole) and empty map."""
    out: set[Path] = set()
    for key, value in obj.items():
        path = (*prefix, str(key))
        if isinstance(value, Mapping) and value:
            out |= leaves(value, path)
        else:
            out.add(path)
    return out


def configuration(applied: Mapping[str, Any]) -> Obj:
    """What of an apply body a manager may own: no status, no server-set metadata."""
    config = {k: copy.deepcopy(v) for k, v in applied.items() if k != "status"}
    meta = config.get("metadata")
    if isinstance(meta, Mapping):
        config["metadata"] = {k: v for k, v in meta.items() if k not in SERVER_METADATA}
    return config


def to_fields(paths: Iterable[Path]) -> Obj:
    """Paths as a FieldsV1 tree (``{"f:spec": {"f:replicas": {}}}``)."""
    root: Obj = {}
    for path in sorted(paths):
        node = root
        for key in path:
            node = node.setdefault(f"f:{key}", {})
    return root


def from_fields(fields: Mapping[str, Any], prefix: Path = ()) -> set[Path]:
    """The paths of a FieldsV1 tree written by :func:`to_fields`."""
    out: set[Path] = set()
    for key, child in fields.items():
        path = (*prefix, key.removeprefix("f:"))
        out |= from_fields(child, path) if child else {path}
    return out


def _remove(obj: Obj, path: Path, keep: set[Path]) -> None:
    """Remove the field at ``path`` and the maps it leaves empty (but not those in
    ``keep``: still owned by someone)."""
    parents: list[Obj] = [obj]
    for key in path[:-1]:
        child = parents[-1].get(key)
        if not isinstance(child, dict):
            return
        parents.append(child)
    parents[-1].pop(path[-1], None)
    for depth in range(len(path) - 1, 0, -1):
        if parents[depth] or path[:depth] in keep:
            return
        parents[depth - 1].pop(path[depth - 1], None)


def _merge(live: Obj, config: Mapping[str, Any]) -> None:
    for key, value in config.items():
        if isinstance(value, Mapping) and isinstance(live.get(key), dict):
            _merge(live[key], value)
        else:
            live[key] = copy.deepcopy(value)


def apply(
    live: Mapping[str, Any] | None, applied: Mapping[str, Any], manager: str, now: str
) -> Obj:
    """The object after ``manager`` applies ``applied`` (forced) to ``live`` (None: it
    does not exist and is created). Pure: neither argument is changed."""
    result: Obj = copy.deepcopy(dict(live or {}))
    config = configuration(applied)
    wanted = leaves(config)
    entries = list(result.get("metadata", {}).get("managedFields") or ())
    mine = next(
        (e for e in entries if e.get("manager") == manager and e.get("operation") == "Apply"),
        None,
    )
    before = from_fields(mine.get("fieldsV1", {})) if mine else set()
    kept: list[Obj] = []
    others: set[Path] = set()
    for entry in entries:
        if entry is mine:
            continue
        theirs = from_fields(entry.get("fieldsV1", {})) - wanted  # force: what I set is mine
        if theirs:
            kept.append({**entry, "fieldsV1": to_fields(theirs)})
            others |= theirs
    for path in sorted(before - wanted - others, key=len, reverse=True):
        _remove(result, path, wanted | others)
    _merge(result, config)
    result.setdefault("metadata", {})["managedFields"] = [
        *kept,
        {
            "manager": manager,
            "operation": "Apply",
            "apiVersion": str(applied.get("apiVersion", "")),
            "time": now,
            "fieldsType": "FieldsV1",
            "fieldsV1": to_fields(wanted),
        },
    ]
    return result


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> Obj:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``: how the emulator
    hands an apply's outcome to kmock, which only merges."""
    patch: Obj = {key: None for key in old if key not in new}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping) and before:
            sub = merge_patch(before, value)
            if sub:
                patch[key] = sub
        elif key not in old or before != value:
            patch[key] = copy.deepcopy(value)
    return patch


def with_generation(live: Mapping[str, Any] | None, outcome: Obj) -> Obj:
    """``outcome`` (of an apply to ``live``) with ``metadata.generation`` as the API
    server sets it for an object with a ``spec``: 1 on create, +1 when the spec changed,
    else as it was. Objects without a spec are returned as they are."""
    if "spec" not in outcome:
        return outcome
    before = dict((live or {}).get("metadata", {}))
    if live is None:
        generation = 1
    elif live.get("spec") != outcome["spec"]:
        generation = int(before.get("generation") or 0) + 1
    else:
        return outcome
    return {**outcome, "metadata": {**outcome.get("metadata", {}), "generation": generation}}
