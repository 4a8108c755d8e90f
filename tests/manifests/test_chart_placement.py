"""The chart's placement knobs: the operator's and etcd's pods take them (a soft spread
over nodes by default), and the SegtxnCluster and TransactionCoordinator it creates carry
the brokers' and coordinators' (only what is set: the operator's defaults hold for the
rest). Real helm; every object validated, every pod checked against "restricted"."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.manifests.podsecurity import pod_spec, violations
from tests.manifests.support import CHART, Doc, template, validate

Helm = Callable[..., str]

ZONE_SPREAD = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
               "whenUnsatisfiable": "ScheduleAnyway"}  # fmt: skip
TOLERATION = {"key": "dedicated", "operator": "Equal", "value": "segtxn", "effect": "NoSchedule"}
ETCD_AFFINITY = {
    "podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname",
             "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "etcd"}}}
        ]
    }
}  # fmt: skip
VALUES: dict[str, Any] = {
    "operator": {
        "priorityClassName": "ops",
        "nodeSelector": {"pool": "system"},
        "tolerations": [TOLERATION],
        "topologySpreadConstraints": [ZONE_SPREAD],
    },
    "etcd": {"affinity": ETCD_AFFINITY, "priorityClassName": "storage"},
    "cluster": {
        "create": True,
        "brokerPods": {
            "priorityClassName": "segtxn",
            "nodeSelector": {"pool": "streaming"},
            "tolerations": [TOLERATION],
            "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}},
            "topologySpreadConstraints": [ZONE_SPREAD],
        },
        "coordinatorPods": {"affinity": {}, "tolerations": [TOLERATION]},
    },
}


def by_kind(docs: list[Doc], kind: str) -> Doc:
    [found] = [d for d in docs if d["kind"] == kind]
    return found


def selector(doc: Doc) -> dict[str, str]:
    return dict(doc["spec"]["selector"]["matchLabels"])


@pytest.fixture
def placed(helm: Helm, tmp_path: Path) -> list[Doc]:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(VALUES))
    return template(helm, values=values)


def test_by_default_the_charts_pods_prefer_distinct_nodes(helm: Helm) -> None:
    docs = template(helm, "cluster.create=true")
    for kind in ("Deployment", "StatefulSet"):  # the operator, etcd
        doc = by_kind(docs, kind)
        pod = doc["spec"]["template"]["spec"]
        anti = pod["affinity"]["podAntiAffinity"]
        assert list(anti) == ["preferredDuringSchedulingIgnoredDuringExecution"], kind
        [term] = anti["preferredDuringSchedulingIgnoredDuringExecution"]
        assert term["podAffinityTerm"] == {
            "topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchLabels": selector(doc)},
        }
        assert not {"nodeSelector", "tolerations", "priorityClassName"} & set(pod), kind
    # Nothing set: the resources say nothing, and the operator's defaults apply.
    brokers = by_kind(docs, "SegtxnCluster")["spec"]["brokers"]
    assert set(brokers) == {"replicas", "replication", "storage", "settings"}
    assert set(by_kind(docs, "TransactionCoordinator")["spec"]) == {"clusterRef", "replicas"}


def test_the_operator_and_etcd_take_the_knobs(placed: list[Doc]) -> None:
    operator = by_kind(placed, "Deployment")
    pod = operator["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "ops"
    assert pod["nodeSelector"] == {"pool": "system"}
    assert pod["tolerations"] == [TOLERATION]
    # A spread constraint without a labelSelector counts the component's own pods.
    assert pod["topologySpreadConstraints"] == [
        {**ZONE_SPREAD, "labelSelector": {"matchLabels": selector(operator)}}
    ]
    assert "podAntiAffinity" in pod["affinity"]  # no affinity given: the soft default
    etcd = by_kind(placed, "StatefulSet")["spec"]["template"]["spec"]
    assert etcd["affinity"] == ETCD_AFFINITY  # given: replaces the default whole
    assert etcd["priorityClassName"] == "storage"


def test_the_cluster_resources_carry_the_brokers_and_coordinators_knobs(
    placed: list[Doc],
) -> None:
    brokers = by_kind(placed, "SegtxnCluster")["spec"]["brokers"]
    not_placement = ("replicas", "replication", "storage", "settings")
    assert {k: v for k, v in brokers.items() if k not in not_placement} == (
        VALUES["cluster"]["brokerPods"]
    )
    coordinator = by_kind(placed, "TransactionCoordinator")["spec"]
    # An empty affinity is "not set" in values: the operator's default spread applies.
    assert coordinator == {"clusterRef": "segtxn", "replicas": 2, "tolerations": [TOLERATION]}


def test_everything_rendered_with_the_knobs_is_valid_and_restricted(placed: list[Doc]) -> None:
    for doc in placed:
        validate(doc)  # built-ins strictly against Kubernetes 1.30; ours against the CRDs
        assert violations(doc) == []
    # the operator's Deployment, etcd's StatefulSet and its defragmentation CronJob
    assert len([d for d in placed if pod_spec(d) is not None]) == 3


@pytest.mark.parametrize(
    ("sets", "complaint"),
    [
        (("operator.tolerations=dedicated",), "operator.tolerations"),
        (("etcd.nodeSelector=ssd",), "etcd.nodeSelector"),
        (("cluster.brokerPods.replicas=3",), "Additional property replicas is not allowed"),
        (("cluster.coordinatorPods.affinity=soft",), "cluster.coordinatorPods.affinity"),
    ],
)
def test_values_schema_refuses_misshapen_knobs(
    helm: Helm, sets: tuple[str, ...], complaint: str
) -> None:
    args = ["lint", str(CHART)]
    for value in sets:
        args += ["--set", value]
    assert complaint in helm(*args, ok=False)
