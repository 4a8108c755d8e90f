"""The operator at its edges (Kopf against kmock): a coordinator change its own handler
refused is not applied by the cluster's timer, the CRD keeps a grant's subscriptions, and a
spec refused for its grants scales nothing down. Each failed before its fix (a review)."""

from __future__ import annotations

from typing import Any

import kopf
import pytest

from segtxn.operator import render
from segtxn.operator.handlers import OperatorConfig
from segtxn.operator.rollstate import REVISION_LABEL
from tests.manifests.support import crd_schemas
from tests.operator.emulator import NS, Emulator, emulator, operator
from tests.operator.fakebrokers import FakeBrokers, serving
from tests.operator.support import (
    WAIT_S,
    condition_of,
    offline,
    statefulset_rolled,
    status,
    workload_rolled,
)
from tests.operator.test_coordinator_fixed import deployment, ids
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)
DEPLOY = "apps/v1/deployments"
STORE = "etcd://e:2379/review"


def cluster_rolling(emu: Emulator, cluster: str) -> dict[str, Any]:
    found = [c for c in status(emu, "SegtxnCluster", cluster).get("conditions", [])
             if c["type"] == "Rolling"]  # fmt: skip
    return dict(found[0]) if found else {}


async def brokers_running(emu: Emulator, cluster: str) -> None:
    """``cluster`` applied and its brokers running the spec (the test plays the
    StatefulSet's controller): the cluster's timer then takes its coordinators' turn."""
    await wait_until(
        lambda: (
            emu.get("apps/v1/statefulsets", f"{cluster}-broker") is not None
            and status(emu, "SegtxnCluster", cluster).get("observedGeneration") is not None
        ),
        timeout=WAIT_S,
        what=f"{cluster} applied",
    )
    await statefulset_rolled(emu, f"{cluster}-broker")
    for i in range(3):  # the pods of revision r1, Ready, and r1 the update revision
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"{cluster}-broker-{i}", "labels": {REVISION_LABEL: "r1"}},
               "status": {"conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip
        code, body = await emu.call("POST", f"/api/v1/namespaces/{NS}/pods", pod)
        assert code in (200, 201), body
    path = f"/apis/apps/v1/namespaces/{NS}/statefulsets/{cluster}-broker/status"
    code, body = await emu.call("PATCH", path, {"status": {"updateRevision": "r1"}})
    assert code == 200, body
    await wait_until(
        lambda: status(emu, "SegtxnCluster", cluster).get("phase") == "Ready",
        timeout=WAIT_S,
        what=f"{cluster} Ready",
    )


async def coordinators_rolled(emu: Emulator, cluster: str) -> None:
    """tc's Deployment rolled (the test plays its controller): the cluster's coordinators'
    turn has nothing left to do, and says so no more in ``Rolling``."""
    await workload_rolled(emu, "deployments", "tc-coordinator")
    await wait_until(
        lambda: "TransactionCoordinator tc" not in cluster_rolling(emu, cluster).get("message", ""),
        timeout=WAIT_S,
        what="the coordinators' turn done",
    )


async def test_the_clusters_coordinator_turn_does_not_apply_a_refused_ids_change() -> None:
    """A coordinatorIds change is refused by the coordinator's handler (ImmutableField),
    but the cluster's status timer (ordering.coordinators_step) sees the Deployment
    NotApplied (the replica count rode along) and applies the whole rendered spec, ids
    included: the refused change goes through."""
    async with emulator() as emu, operator(emu, offline()):
        await emu.create("SegtxnCluster", "demo", {"metadataStore": {"url": STORE}})
        await emu.create(
            "TransactionCoordinator", "tc", {"clusterRef": "demo", "coordinatorIds": 8}
        )
        await wait_until(lambda: ids(emu) == "8", timeout=WAIT_S, what="the coordinators")
        await brokers_running(emu, "demo")
        await coordinators_rolled(emu, "demo")

        await emu.patch("TransactionCoordinator", "tc",
                        {"spec": {"coordinatorIds": 2, "replicas": 3}})  # fmt: skip
        await wait_until(
            lambda: (
                (condition_of(emu, "TransactionCoordinator", "tc", "Applied") or {}).get("reason")
                == "ImmutableField"
            ),
            timeout=WAIT_S,
            what="Applied False, ImmutableField",
        )
        # The cluster's timer has taken the coordinators' turn (it says so in Rolling).
        await wait_until(
            lambda: "TransactionCoordinator tc" in cluster_rolling(emu, "demo").get("message", ""),
            timeout=WAIT_S,
            what="the cluster's coordinators' turn reaching tc",
        )
        assert (ids(emu), deployment(emu)["spec"]["replicas"]) == ("8", 2), (
            "a refused coordinatorIds change was applied by the cluster's timer: "
            f"{cluster_rolling(emu, 'demo')['message']}"
        )


async def test_another_clusters_coordinator_turn_does_not_move_a_refused_cluster_ref() -> None:
    """A clusterRef change is refused by the coordinator's handler (ImmutableField), but
    the index coordinators_by_cluster now files it under the other cluster, whose timer
    renders it from that cluster's spec (another store) and applies it: the coordinators
    move to another cluster's store, the change the refusal was for."""
    async with emulator() as emu, operator(emu, offline()):
        for name in ("demo", "other"):
            await emu.create("SegtxnCluster", name, {"metadataStore": {"url": STORE + name}})
        await emu.create("TransactionCoordinator", "tc", {"clusterRef": "demo"})
        await wait_until(lambda: emu.get(DEPLOY, "tc-coordinator") is not None,
                         timeout=WAIT_S, what="the coordinators")  # fmt: skip
        for name in ("demo", "other"):
            await brokers_running(emu, name)
        await coordinators_rolled(emu, "demo")

        await emu.patch("TransactionCoordinator", "tc", {"spec": {"clusterRef": "other"}})
        await wait_until(
            lambda: (
                (condition_of(emu, "TransactionCoordinator", "tc", "Applied") or {}).get("reason")
                == "ImmutableField"
            ),
            timeout=WAIT_S,
            what="Applied False, ImmutableField",
        )
        await wait_until(
            lambda: "TransactionCoordinator tc" in cluster_rolling(emu, "other").get("message", ""),
            timeout=WAIT_S,
            what="cluster other's coordinators' turn reaching tc",
        )
        live = deployment(emu)
        assert live["metadata"]["annotations"][render.CLUSTER_ANNOTATION] == "demo", (
            "the refused clusterRef change was applied by cluster other's timer: "
            f"{cluster_rolling(emu, 'other')['message']}"
        )


async def test_a_scale_down_refused_for_its_security_drains_no_broker() -> None:
    """reconcile_cluster's docstring: InvalidSecurity refuses a spec "whole, before
    anything is applied". But the grants are checked only in credentials.ensure_cluster
    (sec.policy()), after the scale-down has drained the brokers that would go and posted
    ScaleDown and ReplicasLost events: a refused spec moves topics off a broker, leaves it
    draining, and says it is scaling. (Low severity: behind a real API server this grant's
    ``subscriptions`` is pruned first, see the last test; any grant policy() refuses and
    the CRD admits reaches this path.)"""
    fake = FakeBrokers({f"demo-broker-{i}": [f"topic://t/n/of-{i}"] for i in range(4)})
    async with serving(fake), emulator() as emu:
        config = OperatorConfig(broker_url=fake.url, coordinator_url="http://127.0.0.1:1")
        async with operator(emu, kopf.Memo(config=config)):
            spec = {"metadataStore": {"url": STORE},
                    "brokers": {"replicas": 4, "replication": "3/2"},
                    "security": {"enabled": True}}  # fmt: skip
            await emu.create("SegtxnCluster", "demo", spec)
            await wait_until(
                lambda: (
                    (condition_of(emu, "SegtxnCluster", "demo", "Applied") or {}).get("status")
                    == "True"
                ),
                timeout=WAIT_S,
                what="the secured cluster applied",
            )
            # One edit: a broker fewer, and a grant the servers refuse (subscriptions
            # restrict consume, which it does not give).
            bad = {"reader": [{"resource": "a/b", "actions": ["produce"], "subscriptions": ["s"]}]}
            edit = {"brokers": {"replicas": 3}, "security": {"roles": bad}}
            await emu.patch("SegtxnCluster", "demo", {"spec": edit})
            await wait_until(
                lambda: (
                    (condition_of(emu, "SegtxnCluster", "demo", "Applied") or {}).get("reason")
                    == "InvalidSecurity"
                ),
                timeout=WAIT_S,
                what="Applied False, InvalidSecurity",
            )
        assert (emu.get("apps/v1/statefulsets", "demo-broker") or {})["spec"]["replicas"] == 4
        events = [r for _, r, _ in emu.events("demo")]
        assert fake.log == [] and fake.homes["demo-broker-3"] == ["topic://t/n/of-3"], (
            f"a spec refused as InvalidSecurity drained brokers: {fake.log}; events {events}"
        )
        assert "ScaleDown" not in events and "ReplicasLost" not in events, events


def test_the_crd_keeps_a_grants_subscriptions() -> None:
    """docs/security.md: a grant may add ``subscriptions`` to restrict its consume, and
    the CRD says roles are "the servers' policy format". But the grant items' schema in
    crds/segtxncluster.yaml declares only resource and actions, with no
    x-kubernetes-preserve-unknown-fields: an API server prunes ``subscriptions``
    silently, and the role gets consume on every subscription (a wider grant than
    written)."""
    spec = crd_schemas()[("segtxn.io/v1alpha1", "SegtxnCluster")]["properties"]["spec"]
    grant = spec["properties"]["security"]["properties"]["roles"]["additionalProperties"]["items"]
    kept = "subscriptions" in grant.get("properties", {}) or grant.get(
        "x-kubernetes-preserve-unknown-fields"
    )
    assert kept, (
        f"a grant's subscriptions are pruned: it declares only {sorted(grant['properties'])}"
    )
