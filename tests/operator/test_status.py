"""Ready means "what runs is the spec": the rollout check on workloads as a controller
would report them (no cluster needed)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from segtxn.operator import render
from segtxn.operator.status import condition, rollout
from tests.manifests.support import validate
from tests.operator.test_render import example


def desired() -> dict[str, Any]:
    objects = render.render_cluster("demo", "segtxn", example("SegtxnCluster")["spec"])
    return next(o for o in objects if o["kind"] == "StatefulSet")


def live(generation: int = 2, **status: int) -> dict[str, Any]:
    """The desired StatefulSet as the API server and its controller would hold it."""
    found = copy.deepcopy(desired())
    wanted = found["spec"]["replicas"]
    found["metadata"]["generation"] = generation
    found["status"] = {
        "observedGeneration": generation,
        "replicas": wanted,
        "updatedReplicas": wanted,
        "readyReplicas": wanted,
        **status,
    }
    return found


def test_up_to_date_and_all_ready_is_ready() -> None:
    state = rollout(live(), desired())
    assert state.ready and state.reason == "Ready"
    assert state.ready_replicas == desired()["spec"]["replicas"]


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        ({"observedGeneration": 1}, "RollingOut"),  # the controller has not seen the change
        ({"updatedReplicas": 1}, "RollingOut"),  # pods still on the old template
        ({"replicas": 4}, "RollingOut"),  # an old pod still running beside the new ones
        ({"readyReplicas": 2}, "NotReady"),  # rolled out, one pod not ready
    ],
)
def test_all_pods_answering_is_not_enough(status: dict[str, int], reason: str) -> None:
    """Every case here has pods answering their probes; before, any of them showed Ready
    as soon as readyReplicas reached the count."""
    state = rollout(live(**status), desired())
    assert not state.ready and state.reason == reason, state.message


def test_a_workload_that_is_not_the_spec_is_not_applied() -> None:
    for change in ("replicas", "image", "hash"):
        found = live()
        if change == "replicas":
            found["spec"]["replicas"] = 5  # e.g. a refused scale-down
        elif change == "image":
            found["spec"]["template"]["spec"]["containers"][0]["image"] = "segtxn:old"
        else:
            found["spec"]["template"]["metadata"]["annotations"][render.CONFIG_HASH] = "x"
        state = rollout(found, desired())
        assert not state.ready and state.reason == "NotApplied", change
        assert "see condition Applied" in state.message


def test_missing_or_never_observed_is_not_ready() -> None:
    assert rollout(None, desired()).reason == "Missing"
    found = live()
    del found["status"]["observedGeneration"]
    assert rollout(found, desired()).reason == "RollingOut"


def test_conditions_and_phases_fit_the_crds() -> None:
    conditions = condition(
        None, kind="Ready", status=False, reason="RollingOut", message="m",
        now="2026-11-26T00:00:00Z", generation=3,
    )  # fmt: skip
    for kind in ("SegtxnCluster", "TransactionCoordinator"):
        spec = {"SegtxnCluster": {"metadataStore": {"url": "etcd://e:2379"}}}.get(
            kind, {"clusterRef": "c"}
        )
        doc = {"apiVersion": "segtxn.io/v1alpha1", "kind": kind, "metadata": {"name": "x"},
               "spec": spec, "status": {"conditions": conditions}}  # fmt: skip
        validate(doc)
    for phase in ("Pending", "Updating", "Ready", "Degraded", "Deleting"):
        validate({"apiVersion": "segtxn.io/v1alpha1", "kind": "SegtxnCluster",
                  "metadata": {"name": "x"}, "spec": {"metadataStore": {"url": "etcd://e:2"}},
                  "status": {"phase": phase}})  # fmt: skip
