"""What the operator's end-to-end tests share: a local segtxn cluster for the handlers'
admin calls, and readers of the emulated resources' status."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import kopf

from segtxn.operator.handlers import OperatorConfig
from tests.operator.emulator import NS, Emulator
from tests.processes import ServerProcess

WAIT_S = 30.0


@dataclass
class Local:
    """A segtxn cluster on this machine, where the operator's admin calls land."""

    store_url: str
    broker: ServerProcess
    coordinator: ServerProcess

    def memo(self) -> kopf.Memo:
        config = OperatorConfig(broker_url=self.broker.url, coordinator_url=self.coordinator.url)
        return kopf.Memo(config=config)


def offline() -> kopf.Memo:
    """The operator with no segtxn to reach, for tests that never need the brokers (no
    scale-down): the coordinators' stats reads fail at once (connection refused)."""
    nowhere = "http://127.0.0.1:1"
    return kopf.Memo(config=OperatorConfig(broker_url=nowhere, coordinator_url=nowhere))


def config_of(
    emu: Emulator, resource: str = "apps/v1/statefulsets", name: str = "demo-broker"
) -> dict[str, Any] | None:
    """The live ConfigMap the pods of a live workload read (the brokers' by default: the
    one its first container's env names), or None when the workload, or the ConfigMap it
    names, does not exist. Read here, not with the operator's own code: it is what is
    tested."""
    workload = emu.get(resource, name)
    containers = [] if workload is None else workload["spec"]["template"]["spec"]["containers"]
    refs = [
        var["valueFrom"]["configMapKeyRef"]["name"]
        for var in (containers[0].get("env") or [] if containers else [])
        if "configMapKeyRef" in var.get("valueFrom", {})
    ]
    return emu.get("v1/configmaps", refs[0]) if refs else None


def status(emu: Emulator, kind: str, name: str) -> dict[str, Any]:
    return dict((emu.mine(kind, name) or {}).get("status", {}))


def tries(emu: Emulator, kind: str, name: str, handler: str) -> int:
    """How many times Kopf has retried ``handler`` on the resource (its progress record)."""
    annotations = (emu.mine(kind, name) or {}).get("metadata", {}).get("annotations", {})
    return int(json.loads(annotations.get(f"segtxn.io/{handler}", "{}")).get("retries", 0))


def condition_of(emu: Emulator, kind: str, name: str, which: str) -> dict[str, Any] | None:
    """The resource's condition ``which`` (its status, reason and message), or None."""
    found = [c for c in status(emu, kind, name).get("conditions", []) if c["type"] == which]
    return dict(found[0]) if found else None


def condition(emu: Emulator, kind: str, name: str, which: str) -> str | None:
    """The status (``True``/``False``) of the resource's condition ``which``, or None."""
    found = condition_of(emu, kind, name, which)
    return None if found is None else str(found["status"])


def orders(namespace: str) -> tuple[dict[str, str], str]:
    """Topic ``orders`` of tenant ``acme`` in ``namespace``: the spec of a ScalableTopic of
    cluster ``demo`` for it, and the topic's name. Each test on its module's shared cluster
    (``shared_local``) takes a namespace of its own: another test's topic may still exist."""
    spec = {"clusterRef": "demo", "tenant": "acme", "namespace": namespace, "topic": "orders"}
    return spec, f"topic://acme/{namespace}/orders"


async def cluster(emu: Emulator, local: Local, **brokers: Any) -> None:
    spec: dict[str, Any] = {"metadataStore": {"url": local.store_url}}
    if brokers:
        spec["brokers"] = brokers
    await emu.create("SegtxnCluster", "demo", spec)


async def statefulset_rolled(emu: Emulator, name: str = "demo-broker") -> None:
    """Play the StatefulSet's controller (no controller runs here): its current template
    seen (its generation observed) and every pod updated and ready.
    What the brokers' roll ends with, and what the coordinators' turn waits for
    (segtxn/operator/ordering.py)."""
    await workload_rolled(emu, "statefulsets", name)


async def workload_rolled(emu: Emulator, plural: str, name: str) -> None:
    """Play the controller of the ``apps/v1`` workload ``plural/name`` (a StatefulSet or a
    Deployment): its generation (the emulator's, bumped by each apply that changed its
    spec) observed, every replica updated and ready."""
    found = emu.get(f"apps/v1/{plural}", name)
    assert found is not None, name
    generation = int(found["metadata"]["generation"])
    replicas = int(found["spec"]["replicas"])
    path = f"/apis/apps/v1/namespaces/{NS}/{plural}/{name}"
    state = {"observedGeneration": generation, "replicas": replicas,
             "updatedReplicas": replicas, "readyReplicas": replicas}  # fmt: skip
    code, body = await emu.call("PATCH", f"{path}/status", {"status": state})
    assert code == 200, body
