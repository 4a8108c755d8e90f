"""The chart's cluster.replication with a real helm: the created SegtxnCluster replicates
3/2 by default (3 brokers), the value reaches spec.brokers.replication as the operator
reads it, "" turns it off, and what the brokers cannot run fails at install time."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from segtxn.ledger.replicas import Replication
from segtxn.operator import replication
from tests.manifests.support import CHART, KUBE_VERSION, Doc, crd_schemas, template, validate
from tests.manifests.test_crds import defaulted

Helm = Callable[..., str]
API = "segtxn.io/v1alpha1"


def cluster(docs: list[Doc]) -> Doc:
    [found] = [d for d in docs if d["kind"] == "SegtxnCluster"]
    validate(found)
    return dict(defaulted(found, crd_schemas()[(API, "SegtxnCluster")]))


def test_the_created_cluster_replicates_3_2_by_default(helm: Helm) -> None:
    spec = cluster(template(helm, "cluster.create=true"))["spec"]
    assert spec["brokers"]["replicas"] == 3
    assert spec["brokers"]["replication"] == "3/2"
    assert replication.wanted(spec) == Replication(3, 2)  # what the operator will run


@pytest.mark.parametrize(
    ("sets", "wanted"),
    [
        (("cluster.replication=",), None),
        (("cluster.brokers=2", "cluster.replication=2/1"), Replication(2, 1)),
        (("cluster.brokers=1", "cluster.replication="), None),
        (("cluster.brokers=5", "cluster.replication=5/3"), Replication(5, 3)),
    ],
)
def test_the_value_reaches_the_cluster(
    helm: Helm, sets: tuple[str, ...], wanted: Replication | None
) -> None:
    spec = cluster(template(helm, "cluster.create=true", *sets))["spec"]
    assert ("replication" in spec["brokers"]) is (wanted is not None)
    assert replication.wanted(spec) == wanted


@pytest.mark.parametrize(
    "sets",
    [("cluster.brokers=2",), ("cluster.replication=3/3",), ("cluster.replication=2/3",)],
    ids=["3/2 on 2 brokers", "A above a majority", "A above W"],
)
def test_what_the_brokers_cannot_run_fails_at_install(helm: Helm, sets: tuple[str, ...]) -> None:
    args = ["template", "rel", str(CHART), "--kube-version", KUBE_VERSION,
            "--set", "cluster.create=true"]  # fmt: skip
    for value in sets:
        args += ["--set", value]
    out = helm(*args, ok=False)
    assert "cluster.replication" in out and "W <= cluster.brokers" in out
    assert '"" (off)' in out  # says how to turn it off


def test_the_values_schema_refuses_what_is_not_w_slash_a(helm: Helm) -> None:
    out = helm("lint", str(CHART), "--set", "cluster.replication=3-2", ok=False)
    assert "cluster.replication" in out
