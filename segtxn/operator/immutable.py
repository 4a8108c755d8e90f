"""Fields of a SegtxnCluster that cannot change once it runs, and the check that refuses
a change to them.

``spec.metadataStore.url`` is where every topic, transaction and ledger record of the
cluster lives. Pointing running brokers and coordinators elsewhere would not move that
data: rolled pods would start on an empty store while the others still use the old one
(half the cluster on each), and the ledgers on the brokers' disks would be named by no
record. The CRD refuses the change too (a CEL rule, ``self == oldSelf``); this check is
the operator's own, for API servers that do not enforce the rule and for resources
edited before it existed.

It compares the spec with what is *applied* (the cluster's ConfigMap), not with Kopf's
last-handled spec: a refused change stays refused on every later run (an update of
another field, an operator restart) until the spec says the old value again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from segtxn.operator import render


@dataclass(frozen=True)
class ImmutableChange:
    """A change to a field that cannot change: which, from what, to what."""

    field: str
    applied: str
    wanted: str

    def message(self) -> str:
        return (
            f"{self.field} cannot change once the cluster exists (from {self.applied!r} to "
            f"{self.wanted!r}): its data is in that store. Set it back to {self.applied!r}; "
            "nothing of this change was applied. To move a cluster to another store, create "
            "a new SegtxnCluster there."
        )


_FIELDS = {"storeUrl": "spec.metadataStore.url"}
"""ConfigMap key -> the spec field it comes from."""


def immutable_changes(
    applied_config: Mapping[str, Any] | None, cluster_spec: Mapping[str, Any]
) -> list[ImmutableChange]:
    """The immutable fields ``cluster_spec`` changes against ``applied_config`` (the data
    of the cluster's live ConfigMap; None before the first apply, when nothing is fixed
    yet). Empty when the spec may be applied."""
    if applied_config is None:
        return []
    wanted = render.cluster_config(cluster_spec)
    return [
        ImmutableChange(field, str(applied_config[key]), wanted[key])
        for key, field in _FIELDS.items()
        if key in applied_config and str(applied_config[key]) != wanted[key]
    ]
