"""How the operator applies what it renders: server-side apply, so the live objects are
what the spec renders, fields dropped from the spec included (Kopf against kmock; no
segtxn processes: nothing here calls the brokers)."""

from __future__ import annotations

from typing import Any

import pytest

from segtxn.operator.kube import FIELD_MANAGER
from segtxn.operator.placement import spread_over_nodes
from segtxn.operator.render import selector
from tests.operator import ssa
from tests.operator.emulator import NS, Emulator, emulator, operator
from tests.operator.support import WAIT_S, config_of, offline, status
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)
STORE = "etcd://e:2379/apply"
STS = "apps/v1/statefulsets"


def pod_spec(emu: Emulator, resource: str = STS, name: str = "demo-broker") -> dict[str, Any]:
    found = emu.get(resource, name)
    assert found is not None, name
    return dict(found["spec"]["template"]["spec"])


async def test_a_field_dropped_from_the_spec_is_dropped_from_the_live_object() -> None:
    """Before, children were JSON-merge-patched: a merge patch removes only what it names
    as null, so a node selector, priority class or node affinity taken out of the spec
    stayed on the StatefulSet for ever (and an affinity dropped for the default spread
    was merged with it)."""
    zone = {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]}]}  # fmt: skip
    knobs = {
        "nodeSelector": {"segtxn.io/pool": "streaming"},
        "priorityClassName": "segtxn-critical",
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": zone}},
    }
    async with emulator() as emu, operator(emu, offline()):
        await emu.create(
            "SegtxnCluster", "demo", {"metadataStore": {"url": STORE}, "brokers": knobs}
        )
        await wait_until(
            lambda: (
                emu.get(STS, "demo-broker") is not None
                and pod_spec(emu).get("nodeSelector") == knobs["nodeSelector"]
            ),
            timeout=WAIT_S,
            what="the knobs applied",
        )
        assert pod_spec(emu)["affinity"] == knobs["affinity"]
        dropped = {"nodeSelector": None, "priorityClassName": None, "affinity": None}
        await emu.patch("SegtxnCluster", "demo", {"spec": {"brokers": dropped}})
        await wait_until(
            lambda: "nodeSelector" not in pod_spec(emu),
            timeout=WAIT_S,
            what="the node selector gone from the live StatefulSet",
        )
        pod = pod_spec(emu)
        assert "priorityClassName" not in pod
        assert pod["affinity"] == spread_over_nodes(selector("demo", "broker"))  # no nodeAffinity
        live = emu.get(STS, "demo-broker")
        assert live is not None
        [entry] = [e for e in live["metadata"]["managedFields"] if e["manager"] == FIELD_MANAGER]
        assert entry["operation"] == "Apply"


async def test_what_others_set_on_a_child_survives_a_reapply() -> None:
    """Server-side apply removes only what the operator applied before: an annotation
    ``kubectl rollout restart`` puts on the pod template, and the controller's status,
    stay when the operator applies a new image."""
    async with emulator() as emu, operator(emu, offline()):
        await emu.create("SegtxnCluster", "demo", {"metadataStore": {"url": STORE}})
        await wait_until(
            lambda: emu.get(STS, "demo-broker") is not None, timeout=WAIT_S, what="brokers"
        )
        path = f"/apis/apps/v1/namespaces/{NS}/statefulsets/demo-broker"
        restarted = {"kubectl.kubernetes.io/restartedAt": "2026-11-30T10:00:00Z"}
        status, body = await emu.call(
            "PATCH", path, {"spec": {"template": {"metadata": {"annotations": restarted}}}}
        )
        assert status == 200, body
        status, body = await emu.call("PATCH", path + "/status", {"status": {"replicas": 3}})
        assert status == 200, body
        await emu.patch("SegtxnCluster", "demo", {"spec": {"image": "segtxn:0.2.0"}})

        def image() -> str:
            return str(pod_spec(emu)["containers"][0]["image"])

        await wait_until(lambda: image() == "segtxn:0.2.0", timeout=WAIT_S, what="new image")
        live = emu.get(STS, "demo-broker")
        assert live is not None
        annotations = live["spec"]["template"]["metadata"]["annotations"]
        assert annotations["kubectl.kubernetes.io/restartedAt"] == "2026-11-30T10:00:00Z"
        assert live["status"] == {"replicas": 3}


def applied_reason(emu: Emulator) -> str | None:
    found = [c for c in status(emu, "SegtxnCluster", "demo").get("conditions", [])
             if c["type"] == "Applied"]  # fmt: skip
    return str(found[0]["reason"]) if found else None


async def test_a_failed_statefulset_apply_leaves_the_previous_configuration_in_use() -> None:
    """Before, the one ConfigMap the brokers read was rewritten before the StatefulSet
    was applied: when the StatefulSet's apply failed, the running brokers' ConfigMap held
    settings the cluster had not applied (a broker restarting then ran them, the others
    did not). Now a new configuration is a new ConfigMap, named by the pod template only
    once that template is applied."""
    async with emulator() as emu, operator(emu, offline()):
        await emu.create("SegtxnCluster", "demo", {"metadataStore": {"url": STORE}})
        await wait_until(
            lambda: config_of(emu) is not None, timeout=WAIT_S, what="the brokers' ConfigMap"
        )
        before = config_of(emu)
        assert before is not None and before["data"]["sessionTtlSeconds"] == "10"

        emu.failing = {STS: 500}
        await emu.patch(
            "SegtxnCluster", "demo", {"spec": {"brokers": {"settings": {"sessionTtlSeconds": 30}}}}
        )
        await wait_until(
            lambda: applied_reason(emu) == "ApplyFailed",
            timeout=WAIT_S,
            what="Applied False: the StatefulSet refused",
        )
        used = config_of(emu)
        assert used is not None
        assert used["metadata"]["name"] == before["metadata"]["name"]
        assert used["data"] == before["data"]  # still the TTL the brokers were started with

        emu.failing = {}
        await wait_until(
            lambda: (config_of(emu) or {}).get("data", {}).get("sessionTtlSeconds") == "30",
            timeout=WAIT_S,
            what="the new configuration in use once the StatefulSet is applied",
        )
        new = config_of(emu)
        assert new is not None and new["metadata"]["name"] != before["metadata"]["name"]
        # The superseded one stays (owned by the cluster, it goes with it): a broker still
        # rolling from the old template can start.
        kept = emu.get("v1/configmaps", before["metadata"]["name"])
        assert kept is not None and kept["data"] == before["data"]
        assert new.get("immutable") is True and kept.get("immutable") is True


def test_the_emulated_apply_removes_only_what_the_manager_dropped() -> None:
    """The emulator's server-side apply itself (tests/operator/ssa.py): what the tests
    above rely on."""
    first = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
             "data": {"a": "1", "b": "2"}}  # fmt: skip
    live = ssa.apply(None, first, "me", "t1")
    live["metadata"]["annotations"] = {"theirs": "x"}  # written by someone else
    live = ssa.apply(live, {**first, "data": {"a": "1"}}, "other", "t2")  # co-owns data.a
    second = ssa.apply(live, {**first, "data": {"c": "3"}}, "me", "t3")
    # b: mine, dropped: gone. a: the other applier still applies it: stays. c: new.
    assert second["data"] == {"a": "1", "c": "3"}
    assert second["metadata"]["annotations"] == {"theirs": "x"}
    assert ssa.merge_patch(live, second)["data"] == {"b": None, "c": "3"}
    # An applier that stops sending its field leaves the rest alone.
    assert ssa.apply(second, {**first, "data": {}}, "other", "t4")["data"] == {"c": "3"}
