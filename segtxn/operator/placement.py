"""Where the operator's pods run and what they may use: the pod-spec fields a
SegtxnCluster's ``spec.brokers`` and a TransactionCoordinator's ``spec`` pass through.

Kubernetes already has a language for placement (affinity, tolerations, node selectors,
topology spread constraints, priority classes) and for resources; segtxn does not invent
another. The fields are copied as given into the pod template the renderers build, and
the API server validates them when the operator applies it (the CRDs keep them as opaque
Kubernetes objects, ``x-kubernetes-preserve-unknown-fields``). Two things are added:

- **A default spread.** A section without ``affinity`` gets a *preferred* pod
  anti-affinity on ``kubernetes.io/hostname`` among its own pods (same instance, same
  component): the scheduler puts brokers (and coordinators) on different nodes when it
  can, and still schedules them all on a one-node cluster (kind, a laptop). A *required*
  rule would leave every pod beyond the number of nodes Pending. ``affinity: {}`` turns
  the default off; any other ``affinity`` replaces it whole.
- **A selector for spread constraints that name none.** A topology spread constraint
  counts the pods its ``labelSelector`` matches; one given without a selector gets the
  component's own (spreading "these brokers"), which is nearly always what was meant.

Nothing here checks the values further: a bad toleration is the API server's to refuse,
and the apply fails with its message (condition ``Applied`` False, ``ApplyFailed``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

Obj = dict[str, Any]

HOSTNAME = "kubernetes.io/hostname"
DEFAULT_RESOURCES: Obj = {
    "requests": {"cpu": "250m", "memory": "256Mi"},
    "limits": {"memory": "1Gi"},
}
"""Container resources when a section gives none."""
FIELDS = ("affinity", "tolerations", "nodeSelector", "topologySpreadConstraints",
          "priorityClassName")  # fmt: skip
"""The pod-spec fields a section passes through (``resources`` is the container's)."""


def spread_over_nodes(select: Mapping[str, str]) -> Obj:
    """The default affinity: prefer, never require, one pod of ``select`` per node."""
    return {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "topologyKey": HOSTNAME,
                        "labelSelector": {"matchLabels": dict(select)},
                    },
                }
            ]
        }
    }


def placement(section: Mapping[str, Any], select: Mapping[str, str]) -> Obj:
    """The pod-spec fields of a spec ``section`` (:data:`FIELDS`) for pods labelled
    ``select``: as given (deep copies), with the default spread when ``affinity`` is
    absent and ``select`` filled into spread constraints without a ``labelSelector``.
    Fields absent or empty are left out of the pod spec."""
    out: Obj = {}
    affinity = section["affinity"] if "affinity" in section else spread_over_nodes(select)
    if affinity:
        out["affinity"] = copy.deepcopy(dict(affinity))
    if section.get("tolerations"):
        out["tolerations"] = [copy.deepcopy(dict(t)) for t in section["tolerations"]]
    if section.get("nodeSelector"):
        out["nodeSelector"] = {str(k): str(v) for k, v in section["nodeSelector"].items()}
    constraints = [
        {"labelSelector": {"matchLabels": dict(select)}, **copy.deepcopy(dict(c))}
        for c in section.get("topologySpreadConstraints") or ()
    ]
    if constraints:
        out["topologySpreadConstraints"] = constraints
    if section.get("priorityClassName"):
        out["priorityClassName"] = str(section["priorityClassName"])
    return out


def resources(section: Mapping[str, Any]) -> Obj:
    """The container resources of a spec ``section``: as given, else
    :data:`DEFAULT_RESOURCES`."""
    return copy.deepcopy(dict(section.get("resources") or DEFAULT_RESOURCES))
