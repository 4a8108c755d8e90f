"""Every pod segtxn deploys passes Pod Security "restricted": the chart's (helm template
under each value set), the operator's (its render functions) and the verify Job's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml

from segtxn.operator import render
from tests.manifests.podsecurity import pod_spec, violations
from tests.manifests.support import ROOT, template
from tests.manifests.test_chart import VALUE_SETS
from tests.operator.test_render import example, minimal

Helm = Callable[..., str]


@pytest.mark.parametrize("sets", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_chart_pods_are_restricted(helm: Helm, sets: tuple[str, ...]) -> None:
    docs = template(helm, *sets)
    with_pods = [d for d in docs if pod_spec(d) is not None]
    assert with_pods  # the operator at least
    assert [v for d in with_pods for v in violations(d)] == []


def operator_objects() -> list[dict[str, Any]]:
    cluster = example("SegtxnCluster")["spec"]
    small = minimal("SegtxnCluster", {"metadataStore": {"url": "etcd://e:2379"}})
    coordinator = minimal("TransactionCoordinator", {"clusterRef": "demo"})
    return [
        *render.render_cluster("demo", "segtxn", cluster),
        *render.render_cluster("small", "segtxn", small),
        *render.render_coordinator("demo", "segtxn", coordinator, cluster),
    ]


def test_operator_pods_are_restricted() -> None:
    objects = operator_objects()
    assert sorted(o["kind"] for o in objects if pod_spec(o) is not None) == [
        "Deployment",
        "StatefulSet",
        "StatefulSet",
    ]
    assert [v for o in objects for v in violations(o)] == []


def test_verify_job_is_restricted() -> None:
    job = yaml.safe_load((ROOT / "manifests" / "spark" / "verify-job.yaml").read_text())
    assert violations(job) == []


def test_the_checker_catches_what_restricted_refuses() -> None:
    """The checker itself: a pod as it was before (no seccompProfile) and other breaches."""
    sts = next(o for o in operator_objects() if o["kind"] == "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    del pod["securityContext"]["seccompProfile"]
    container = pod["containers"][0]["securityContext"]
    container["capabilities"] = {"drop": ["NET_RAW"], "add": ["SYS_ADMIN"]}
    del container["allowPrivilegeEscalation"]
    pod["hostNetwork"] = True
    pod["volumes"] = [{"name": "h", "hostPath": {"path": "/"}}]
    found = violations(sts)
    for breach in (
        "seccompProfile.type is None",
        "capabilities.drop lacks ALL",
        "capabilities.add ['SYS_ADMIN']",
        "allowPrivilegeEscalation is not false",
        "hostNetwork",
        "volume h is hostPath",
    ):
        assert any(breach in v for v in found), (breach, found)
    pod["securityContext"]["runAsNonRoot"] = False
    assert any("runAsNonRoot is not true" in v for v in violations(sts))
