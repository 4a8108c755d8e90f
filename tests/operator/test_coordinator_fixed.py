"""A TransactionCoordinator's ids and cluster are fixed once its coordinators run: a change
to either is refused whole and named (Kopf against kmock, no segtxn processes; kmock does
not run the CRD's CEL rules, so this is the operator's own defence)."""

from __future__ import annotations

from typing import Any

import pytest

from segtxn.operator import render
from segtxn.operator.immutable import coordinator_changes
from tests.manifests.support import crd_schemas
from tests.operator.emulator import Emulator, emulator, operator
from tests.operator.support import WAIT_S, condition, condition_of, offline
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)
DEPLOY = "apps/v1/deployments"
STORE = "etcd://e:2379/fixed"


def deployment(emu: Emulator) -> dict[str, Any]:
    found = emu.get(DEPLOY, "tc-coordinator")
    assert found is not None
    return found


def ids(emu: Emulator) -> str | None:
    found = emu.get(DEPLOY, "tc-coordinator")
    args = [] if found is None else found["spec"]["template"]["spec"]["containers"][0]["args"]
    return next((a.removeprefix("--ids=") for a in args if a.startswith("--ids=")), None)


def applied(emu: Emulator) -> dict[str, Any]:
    return condition_of(emu, "TransactionCoordinator", "tc", "Applied") or {}


@pytest.mark.parametrize(
    ("change", "field"),
    [({"coordinatorIds": 4}, "spec.coordinatorIds"), ({"clusterRef": "other"}, "spec.clusterRef")],
    ids=["ids", "cluster"],
)
async def test_a_change_of_the_ids_or_the_cluster_is_refused_whole(
    change: dict[str, Any], field: str
) -> None:
    async with emulator() as emu, operator(emu, offline()):
        for name in ("demo", "other"):
            await emu.create("SegtxnCluster", name, {"metadataStore": {"url": STORE + name}})
        await emu.create(
            "TransactionCoordinator", "tc", {"clusterRef": "demo", "coordinatorIds": 8}
        )
        await wait_until(lambda: ids(emu) == "8", timeout=WAIT_S, what="the coordinators")
        annotations = deployment(emu)["metadata"]["annotations"]
        assert annotations[render.CLUSTER_ANNOTATION] == "demo"

        # The replica count rides along: it must not be applied either (never half-applied).
        await emu.patch("TransactionCoordinator", "tc", {"spec": {**change, "replicas": 3}})
        await wait_until(
            lambda: applied(emu).get("reason") == "ImmutableField",
            timeout=WAIT_S,
            what="Applied False, ImmutableField",
        )
        assert applied(emu)["status"] == "False"
        assert f"{field} cannot change once the coordinators exist" in applied(emu)["message"]
        assert any(
            (kind, reason) == ("Warning", "ImmutableField") and field in message
            for kind, reason, message in emu.events("tc")
        )
        assert ids(emu) == "8" and deployment(emu)["spec"]["replicas"] == 2
        assert deployment(emu)["metadata"]["annotations"][render.CLUSTER_ANNOTATION] == "demo"

        # Set back, the rest of the change goes through.
        await emu.patch(
            "TransactionCoordinator", "tc", {"spec": {"coordinatorIds": 8, "clusterRef": "demo"}}
        )
        await wait_until(
            lambda: deployment(emu)["spec"]["replicas"] == 3,
            timeout=WAIT_S,
            what="the replicas applied once the field is back",
        )
        await wait_until(
            lambda: condition(emu, "TransactionCoordinator", "tc", "Applied") == "True",
            timeout=WAIT_S,
            what="Applied True again",
        )


def test_what_is_fixed_is_what_the_live_deployment_runs() -> None:
    cluster = {"metadataStore": {"url": STORE}}
    spec = {"clusterRef": "demo", "coordinatorIds": 8}
    [_, live, *_] = render.render_coordinator("tc", "ns", spec, cluster)
    assert coordinator_changes(None, spec) == []  # nothing applied: nothing fixed yet
    assert coordinator_changes(live, spec) == []
    assert coordinator_changes(live, {**spec, "replicas": 5}) == []
    [ids_change] = coordinator_changes(live, {"clusterRef": "demo"})  # the default, 4
    assert (ids_change.field, ids_change.applied, ids_change.wanted) == (
        "spec.coordinatorIds",
        "8",
        "4",
    )
    [moved] = coordinator_changes(live, {**spec, "clusterRef": "c2"})
    assert (moved.field, moved.applied, moved.wanted) == ("spec.clusterRef", "demo", "c2")
    del live["metadata"]["annotations"]  # applied before the annotation existed
    assert coordinator_changes(live, {**spec, "clusterRef": "c2"}) == []


def test_the_crd_refuses_the_same_changes() -> None:
    """The API server refuses them itself (CEL transition rules), as ScalableTopic's
    clusterRef."""
    fields = crd_schemas()[("segtxn.io/v1alpha1", "TransactionCoordinator")]["properties"]["spec"][
        "properties"
    ]
    for name in ("coordinatorIds", "clusterRef"):
        assert [v["rule"] for v in fields[name]["x-kubernetes-validations"]] == ["self == oldSelf"]
