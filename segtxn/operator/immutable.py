"""Fields of a SegtxnCluster that cannot change once it runs, and the check that refuses
a change to them, whole, before anything is applied.

- ``spec.metadataStore.url`` is where every topic, transaction and ledger record of the
  cluster lives. Pointing running brokers and coordinators elsewhere would not move that
  data: rolled pods would start on an empty store while the others still use the old one
  (half the cluster on each), and the ledgers on the brokers' disks would be named by no
  record.
- ``spec.brokers.storage`` (size and class) shapes the StatefulSet's volume claim
  templates, which Kubernetes refuses to change: the apply would fail on the StatefulSet
  every time (the rest of the edit with it: the new ConfigMap it names is never used).
- ``spec.brokers.replication`` may be turned on, or change its ``W/A``, but not be
  turned off (:func:`.replication.turned_off`): brokers without it cannot read the
  replicated ledgers.

Of a TransactionCoordinator (:func:`coordinator_changes`):

- ``spec.coordinatorIds``: coordinators campaign only for ids ``0..coordinatorIds-1``;
  lowering it leaves the open transactions and the GC work of the ids above with no
  coordinator, and the ids' state stays in the cluster's store whatever the spec says.
- ``spec.clusterRef``: the coordinators' ids, their open transactions and their GC work
  are in that cluster's store; pointing them at another cluster orphans all of it.

The CRD refuses these changes too (CEL rules, ``self == oldSelf``); this check is the
operator's own, for API servers that do not enforce the rules and for resources edited
before they existed. It compares the spec with what is *applied* (the live StatefulSet
and the ConfigMap its pods read), not with Kopf's last-handled spec: a refused change
stays refused on every later run (an update of another field, an operator restart) until
the spec says the applied value again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from segtxn.operator import render, replication

_STORE = (
    "its data is in that store. To move a cluster to another store, create a new "
    "SegtxnCluster there"
)
_REPLICATION = (
    "brokers started without --replication read only their own ledger files, so every "
    "ledger written replicated (and its topic) would become unreadable. Any W/A may be "
    "set instead; to run without replication, create a new SegtxnCluster"
)
_STORAGE = (
    "a StatefulSet's volume claims are fixed (Kubernetes refuses the change). To grow the "
    "brokers' volumes, expand each PersistentVolumeClaim data-<cluster>-broker-<i> (if its "
    "StorageClass allows expansion)"
)


_IDS = (
    "coordinators serve only the ids below it: fewer would leave the open transactions and "
    "GC work of the others with no coordinator. The ids are fixed for the cluster's life"
)
_CLUSTER = (
    "the coordinators' ids, open transactions and GC work are in that cluster's store. To "
    "serve another cluster, create another TransactionCoordinator"
)
_COORDINATORS = "cannot change once the coordinators exist"


_SUFFIXES = {
    "": Decimal(1), "m": Decimal("0.001"), "k": Decimal(10**3), "M": Decimal(10**6),
    "G": Decimal(10**9), "T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}  # fmt: skip
_QUANTITY = re.compile(r"([0-9.]+)([a-zA-Z]*)")


def same_quantity(a: str, b: str) -> bool:
    """Whether two Kubernetes quantities are equal: the API server stores its canonical
    form (``1.5Gi`` comes back as ``1536Mi``), so the strings may differ. Unparsable ones
    compare as strings."""
    parsed = []
    for text in (a, b):
        found = _QUANTITY.fullmatch(text.strip())
        if found is None or found.group(2) not in _SUFFIXES:
            return a == b
        try:
            parsed.append(Decimal(found.group(1)) * _SUFFIXES[found.group(2)])
        except InvalidOperation:
            return a == b
    return parsed[0] == parsed[1]


@dataclass(frozen=True)
class ImmutableChange:
    """A change to a field that cannot change: which, from what, to what, and why not."""

    field: str
    applied: str
    wanted: str
    why: str
    rule: str = "cannot change once the cluster exists"

    def message(self) -> str:
        return (
            f"{self.field} {self.rule} (from {self.applied!r} to {self.wanted!r}): "
            f"{self.why}. Set it back to {self.applied!r}; nothing of this change was applied."
        )


def immutable_changes(
    applied_config: Mapping[str, Any] | None,
    applied_brokers: Mapping[str, Any] | None,
    cluster_spec: Mapping[str, Any],
) -> list[ImmutableChange]:
    """The immutable fields ``cluster_spec`` changes against what is applied: the data of
    the ConfigMap the live broker StatefulSet's pods read, and that StatefulSet (each
    None before the first apply, when nothing is fixed yet). Empty when the spec may be
    applied."""
    changes = []
    if applied_config is not None and "storeUrl" in applied_config:
        url = render.cluster_config(cluster_spec)["storeUrl"]
        if str(applied_config["storeUrl"]) != url:
            changes.append(
                ImmutableChange(
                    "spec.metadataStore.url", str(applied_config["storeUrl"]), url, _STORE
                )
            )
    running = replication.turned_off(applied_config, cluster_spec)
    if running is not None:
        changes.append(
            ImmutableChange(replication.FIELD, running, "off", _REPLICATION, "cannot be turned off")
        )
    claims = (applied_brokers or {}).get("spec", {}).get("volumeClaimTemplates") or []
    if claims:
        claim = claims[0].get("spec", {})
        size = str(claim.get("resources", {}).get("requests", {}).get("storage", ""))
        storage_class = str(claim.get("storageClassName") or "")
        wanted_size, wanted_class = render.broker_storage(cluster_spec)
        if not same_quantity(size, wanted_size):
            changes.append(
                ImmutableChange("spec.brokers.storage.size", size, wanted_size, _STORAGE)
            )
        if storage_class != wanted_class:
            changes.append(
                ImmutableChange(
                    "spec.brokers.storage.storageClassName",
                    storage_class,
                    wanted_class,
                    _STORAGE,
                )
            )
    return changes


def coordinator_changes(
    applied: Mapping[str, Any] | None, spec: Mapping[str, Any]
) -> list[ImmutableChange]:
    """The immutable fields of TransactionCoordinator ``spec`` that change against its
    live Deployment (``applied``; None before the first apply, when nothing is fixed yet):
    the ``--ids`` its coordinators run with, the cluster it names
    (:data:`.render.CLUSTER_ANNOTATION`; a Deployment applied before it existed fixes no
    cluster). Empty when the spec may be applied."""
    if applied is None:
        return []
    changes = []
    wanted_ids = str(spec.get("coordinatorIds", render.COORDINATOR_IDS))
    containers = applied.get("spec", {}).get("template", {}).get("spec", {}).get("containers")
    for arg in (containers or [{}])[0].get("args") or ():
        if str(arg).startswith("--ids=") and str(arg)[len("--ids=") :] != wanted_ids:
            running = str(arg)[len("--ids=") :]
            changes.append(
                ImmutableChange("spec.coordinatorIds", running, wanted_ids, _IDS, _COORDINATORS)
            )
    annotations = applied.get("metadata", {}).get("annotations") or {}
    cluster = annotations.get(render.CLUSTER_ANNOTATION)
    wanted_cluster = str(spec.get("clusterRef", ""))
    if cluster is not None and str(cluster) != wanted_cluster:
        changes.append(
            ImmutableChange(
                "spec.clusterRef", str(cluster), wanted_cluster, _CLUSTER, _COORDINATORS
            )
        )
    return changes
