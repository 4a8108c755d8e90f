"""Placement and resources of brokers and coordinators: the CRDs take them, the renderers
pass them into valid, Pod-Security-restricted pod templates, the default spreads pods
over nodes without requiring it, and the operator applies them (Kopf against kmock)."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from segtxn.operator import render
from segtxn.operator.placement import HOSTNAME, spread_over_nodes
from tests.manifests.podsecurity import violations
from tests.manifests.support import validate
from tests.operator.emulator import emulator, operator
from tests.operator.support import WAIT_S, offline
from tests.operator.test_render import API, by_kind, minimal
from tests.waiting import wait_until

STORE = "etcd://e:2379/place"
KNOBS: dict[str, Any] = {
    "priorityClassName": "segtxn-critical",
    "nodeSelector": {"segtxn.io/pool": "streaming"},
    "tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "segtxn", "effect": "NoSchedule"}
    ],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "topology.kubernetes.io/zone",
                                "operator": "In",
                                "values": ["a", "b", "c"],
                            }
                        ]
                    }
                ]
            }
        }
    },
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
        }
    ],
    "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}},
}


def rendered(brokers: dict[str, Any], coordinator: dict[str, Any]) -> dict[str, render.Obj]:
    cluster = minimal("SegtxnCluster", {"metadataStore": {"url": STORE}, "brokers": brokers})
    tc = minimal("TransactionCoordinator", {"clusterRef": "demo", **coordinator})
    return by_kind(
        [
            *render.render_cluster("demo", "segtxn", cluster),
            *render.render_coordinator("demo", "segtxn", tc, cluster),
        ]
    )


def pods(objects: dict[str, render.Obj]) -> dict[str, dict[str, Any]]:
    return {
        "brokers": objects["StatefulSet/demo-broker"]["spec"]["template"]["spec"],
        "coordinators": objects["Deployment/demo-coordinator"]["spec"]["template"]["spec"],
    }


def selectors(objects: dict[str, render.Obj]) -> dict[str, dict[str, str]]:
    return {
        "brokers": objects["StatefulSet/demo-broker"]["spec"]["selector"]["matchLabels"],
        "coordinators": objects["Deployment/demo-coordinator"]["spec"]["selector"]["matchLabels"],
    }


def test_by_default_pods_prefer_distinct_nodes_and_never_require_them() -> None:
    objects = rendered({}, {})
    for who, pod in pods(objects).items():
        affinity = pod["affinity"]
        assert affinity == spread_over_nodes(selectors(objects)[who]), who
        [term] = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert term["podAffinityTerm"]["topologyKey"] == HOSTNAME
        # A required rule would leave a second broker Pending on a one-node cluster.
        assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity["podAntiAffinity"]
        assert not {"nodeSelector", "tolerations", "priorityClassName"} & set(pod), who
    for obj in objects.values():
        validate(obj)


def test_the_knobs_reach_the_pod_templates_valid_and_restricted() -> None:
    objects = rendered(KNOBS, KNOBS)
    for who, pod in pods(objects).items():
        assert pod["priorityClassName"] == "segtxn-critical", who
        assert pod["nodeSelector"] == KNOBS["nodeSelector"]
        assert pod["tolerations"] == KNOBS["tolerations"]
        assert pod["affinity"] == KNOBS["affinity"]  # replaces the default spread whole
        [constraint] = pod["topologySpreadConstraints"]
        # No labelSelector given: it counts this component's pods.
        assert constraint == {
            **KNOBS["topologySpreadConstraints"][0],
            "labelSelector": {"matchLabels": selectors(objects)[who]},
        }
        assert pod["containers"][0]["resources"] == KNOBS["resources"]
    for obj in objects.values():
        validate(obj)  # kubernetes-validate --strict: every passed field is a real one
        assert violations(obj) == []


def test_an_empty_affinity_turns_the_default_off_and_a_given_selector_is_kept() -> None:
    own = {"matchLabels": {"app": "other"}}
    constraint = {"maxSkew": 2, "topologyKey": HOSTNAME, "whenUnsatisfiable": "DoNotSchedule",
                  "labelSelector": own}  # fmt: skip
    objects = rendered({"affinity": {}, "topologySpreadConstraints": [constraint]}, {})
    brokers = pods(objects)["brokers"]
    assert "affinity" not in brokers
    assert brokers["topologySpreadConstraints"] == [constraint]
    assert "affinity" in pods(objects)["coordinators"]  # the other section keeps its default


def test_rendering_does_not_share_the_specs_objects() -> None:
    """The pod spec holds copies: Kopf's adopt and the apply never write into the spec."""
    brokers = {"tolerations": [{"key": "k", "operator": "Exists"}]}
    pod = pods(rendered(brokers, {}))["brokers"]
    pod["tolerations"][0]["key"] = "changed"
    assert brokers["tolerations"][0]["key"] == "k"


def test_disruption_budgets_let_one_pod_go_at_a_time() -> None:
    objects = rendered({}, {})
    for who, name in (("brokers", "demo-broker"), ("coordinators", "demo-coordinator")):
        pdb = objects[f"PodDisruptionBudget/{name}"]["spec"]
        assert pdb == {"maxUnavailable": 1, "selector": {"matchLabels": selectors(objects)[who]}}


@pytest.mark.parametrize("kind", ["SegtxnCluster", "TransactionCoordinator"])
def test_the_crds_take_the_knobs_and_refuse_wrong_shapes(kind: str) -> None:
    def doc(knobs: dict[str, Any]) -> dict[str, Any]:
        spec: dict[str, Any] = (
            {"metadataStore": {"url": STORE}, "brokers": knobs}
            if kind == "SegtxnCluster"
            else {"clusterRef": "demo", **knobs}
        )
        return {"apiVersion": API, "kind": kind, "metadata": {"name": "x"}, "spec": spec}

    validate(doc(KNOBS))
    for wrong, complaint in (
        ({"nodeSelector": {"pool": 3}}, "is not of type 'string'"),
        ({"tolerations": {"key": "k"}}, "is not of type 'array'"),
        ({"affinity": ["x"]}, "is not of type 'object'"),
        ({"priorityClassName": 7}, "is not of type 'string'"),
    ):
        with pytest.raises(jsonschema.ValidationError, match=complaint):
            validate(doc(wrong))


async def test_the_operator_applies_the_knobs_to_brokers_and_coordinators() -> None:
    async with emulator() as emu, operator(emu, offline()):
        await emu.create("SegtxnCluster", "demo", {"metadataStore": {"url": STORE},
                                                   "brokers": KNOBS})  # fmt: skip
        await emu.create("TransactionCoordinator", "demo", {"clusterRef": "demo", **KNOBS})

        def live(resource: str, name: str) -> dict[str, Any] | None:
            found = emu.get(resource, name)
            return None if found is None else dict(found["spec"]["template"]["spec"])

        def applied(pod: dict[str, Any] | None) -> bool:
            return pod is not None and pod.get("priorityClassName") == "segtxn-critical"

        await wait_until(
            lambda: (
                applied(live("apps/v1/statefulsets", "demo-broker"))
                and applied(live("apps/v1/deployments", "demo-coordinator"))
            ),
            timeout=WAIT_S,
            what="placement on the brokers' and the coordinators' pod templates",
        )
        for pod in (live("apps/v1/statefulsets", "demo-broker"),
                    live("apps/v1/deployments", "demo-coordinator")):  # fmt: skip
            assert pod is not None
            assert pod["nodeSelector"] == KNOBS["nodeSelector"]
            assert pod["tolerations"] == KNOBS["tolerations"]
            assert pod["affinity"] == KNOBS["affinity"]
            assert pod["containers"][0]["resources"] == KNOBS["resources"]
