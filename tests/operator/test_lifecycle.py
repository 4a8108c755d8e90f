"""A running cluster changed through its SegtxnCluster: upgrades reach every child, and
what must not change (the store URL) or would strand data (a scale-down) is refused whole
(Kopf against kmock, real segtxn processes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from segtxn.client import Client
from segtxn.operator import clusters
from segtxn.operator.render import CONFIG_HASH
from tests import processes
from tests.operator.emulator import Emulator, emulator, operator
from tests.operator.support import (
    WAIT_S,
    Local,
    cluster,
    condition_of,
    config_of,
    statefulset_rolled,
    tries,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(180)


def pod_template(emu: Emulator, resource: str, name: str) -> dict[str, Any]:
    found = emu.get(resource, name)
    assert found is not None, name
    return dict(found["spec"]["template"])


def image(emu: Emulator, resource: str, name: str) -> str:
    return str(pod_template(emu, resource, name)["spec"]["containers"][0]["image"])


def config_hash(emu: Emulator, resource: str, name: str) -> str:
    return str(pod_template(emu, resource, name)["metadata"]["annotations"][CONFIG_HASH])


def applied(emu: Emulator, kind: str, name: str) -> dict[str, Any] | None:
    return condition_of(emu, kind, name, "Applied")


async def running(emu: Emulator, local: Local) -> None:
    """Cluster ``demo`` and its coordinators ``demo``, their children applied."""
    await cluster(emu, local)
    await emu.create("TransactionCoordinator", "demo", {"clusterRef": "demo"})
    await wait_until(
        lambda: (
            emu.get("apps/v1/statefulsets", "demo-broker") is not None
            and emu.get("apps/v1/deployments", "demo-coordinator") is not None
        ),
        timeout=WAIT_S,
        what="brokers and coordinators rendered",
    )


async def test_image_and_session_ttl_changes_reach_the_coordinators_too(
    shared_local: Local,
) -> None:
    async with emulator() as emu, operator(emu, shared_local.memo()):
        await running(emu, shared_local)
        hashes = {
            "brokers": config_hash(emu, "apps/v1/statefulsets", "demo-broker"),
            "coordinators": config_hash(emu, "apps/v1/deployments", "demo-coordinator"),
        }
        await emu.patch(
            "SegtxnCluster",
            "demo",
            {"spec": {"image": "segtxn:0.2.0", "brokers": {"settings": {"sessionTtlSeconds": 20}}}},
        )

        def everything_updated() -> bool:
            return (
                image(emu, "apps/v1/statefulsets", "demo-broker") == "segtxn:0.2.0"
                and image(emu, "apps/v1/deployments", "demo-coordinator") == "segtxn:0.2.0"
                and config_hash(emu, "apps/v1/deployments", "demo-coordinator")
                != hashes["coordinators"]
            )

        # The brokers first: the coordinators follow once the brokers run the new spec
        # (segtxn/operator/ordering.py; their roll is test_ordering.py's).
        await wait_until(lambda: image(emu, "apps/v1/statefulsets", "demo-broker") ==
                         "segtxn:0.2.0", timeout=WAIT_S, what="the brokers")  # fmt: skip
        assert image(emu, "apps/v1/deployments", "demo-coordinator") == "segtxn:0.1.0"
        await statefulset_rolled(emu)
        # Before the fix the coordinators kept the old image and TTL until their own spec
        # changed: only the brokers were re-rendered.
        await wait_until(everything_updated, timeout=WAIT_S, what="brokers and coordinators")
        assert config_hash(emu, "apps/v1/statefulsets", "demo-broker") != hashes["brokers"]
        config = config_of(emu)
        assert config is not None and config["data"]["sessionTtlSeconds"] == "20"
        coordinators = config_of(emu, "apps/v1/deployments", "demo-coordinator")
        assert coordinators is not None and coordinators["data"]["sessionTtlSeconds"] == "20"
        # The coordinators roll one at a time, a new one ready before an old one goes.
        deployment = emu.get("apps/v1/deployments", "demo-coordinator")
        assert deployment is not None
        assert deployment["spec"]["strategy"]["rollingUpdate"] == {
            "maxUnavailable": 0,
            "maxSurge": 1,
        }
        await wait_until(
            lambda: any(
                reason == "Applied" and "re-rendered for SegtxnCluster demo" in message
                for _, reason, message in emu.events("demo")
            ),
            timeout=WAIT_S,
            what="the coordinators' Applied event",
        )


async def test_a_store_url_change_is_refused_whole_and_named(shared_local: Local) -> None:
    async with emulator() as emu, operator(emu, shared_local.memo()):
        await running(emu, shared_local)
        # kmock does not run the CRD's CEL rule (a real API server would refuse the patch):
        # this is the operator's own defence. The image change rides along: it must not
        # be applied either (never half-applied).
        await emu.patch(
            "SegtxnCluster",
            "demo",
            {
                "spec": {
                    "image": "segtxn:0.2.0",
                    "metadataStore": {"url": shared_local.store_url + "x"},
                }
            },
        )
        await wait_until(
            lambda: (applied(emu, "SegtxnCluster", "demo") or {}).get("status") == "False",
            timeout=WAIT_S,
            what="the Applied condition False",
        )
        refused = applied(emu, "SegtxnCluster", "demo")
        assert refused is not None and refused["reason"] == "ImmutableField"
        assert "spec.metadataStore.url cannot change" in refused["message"]
        await wait_until(
            lambda: any(
                kind == "Warning"
                and reason == "ImmutableField"
                and "spec.metadataStore.url" in message
                for kind, reason, message in emu.events("demo")
            ),
            timeout=WAIT_S,
            what="a Warning event naming the field",
        )
        config = config_of(emu)
        assert config is not None and config["data"]["storeUrl"] == shared_local.store_url
        assert image(emu, "apps/v1/statefulsets", "demo-broker") == "segtxn:0.1.0"
        assert image(emu, "apps/v1/deployments", "demo-coordinator") == "segtxn:0.1.0"

        # The URL set back, the rest of the change goes through.
        await emu.patch("SegtxnCluster", "demo", {"spec": {"metadataStore": {
            "url": shared_local.store_url}}})  # fmt: skip
        await wait_until(lambda: image(emu, "apps/v1/statefulsets", "demo-broker") ==
                         "segtxn:0.2.0", timeout=WAIT_S, what="the brokers")  # fmt: skip
        await statefulset_rolled(emu)
        await wait_until(
            lambda: image(emu, "apps/v1/deployments", "demo-coordinator") == "segtxn:0.2.0",
            timeout=WAIT_S,
            what="the image applied once the URL is back",
        )
        assert image(emu, "apps/v1/statefulsets", "demo-broker") == "segtxn:0.2.0"
        await wait_until(
            lambda: (applied(emu, "SegtxnCluster", "demo") or {}).get("status") == "True",
            timeout=WAIT_S,
            what="Applied True again",
        )


async def test_a_scale_down_that_would_strand_data_is_refused(
    local: Local, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Brokers demo-broker-0 (``local.broker``, id b1 here) and demo-broker-1 share the
    store; a topic with a segment on demo-broker-1 forbids going down to one broker until
    the topic is deleted."""
    monkeypatch.setattr(clusters, "SCALE_DOWN_RECHECK_S", 0.5)
    second = processes.broker(local.store_url, tmp_path / "b2", "demo-broker-1", session_ttl=2)
    second.start()
    try:
        await second.ready()
        async with (
            emulator() as emu,
            operator(emu, local.memo()),
            Client(local.broker.url) as client,
        ):
            await cluster(emu, local, replicas=2)
            await wait_until(
                lambda: replicas(emu) == 2, timeout=WAIT_S, what="two brokers rendered"
            )
            await client.admin.create_topic("topic://acme/ops/scale", segments=2)
            held = await client.admin.broker_homes("demo-broker-1")
            assert held.homes == ["segment://acme/ops/scale/1"]  # the fewest homes: one each

            await emu.patch("SegtxnCluster", "demo", {"spec": {"brokers": {"replicas": 1}}})
            await wait_until(
                lambda: (
                    (applied(emu, "SegtxnCluster", "demo") or {}).get("reason")
                    == "ScaleDownRefused"
                ),
                timeout=WAIT_S,
                what="the scale-down refused",
            )
            refused = applied(emu, "SegtxnCluster", "demo")
            assert refused is not None and refused["status"] == "False"
            assert "demo-broker-1 holds segment://acme/ops/scale/1" in refused["message"]
            assert "Delete those topics first" in refused["message"]
            assert "GET /admin/v2/brokers/demo-broker-1/homes" in refused["message"]
            assert "set spec.brokers.replicas back to 2" in refused["message"]

            def warnings() -> list[str]:
                return [
                    message
                    for kind, reason, message in emu.events("demo")
                    if (kind, reason) == ("Warning", "ScaleDownRefused")
                ]

            # Events are posted through Kopf's queue, after the status: on a busy machine
            # the condition was read before the event existed (assert [] == [message]).
            await wait_until(lambda: bool(warnings()), timeout=WAIT_S, what="the warning event")
            assert warnings() == [refused["message"]]  # one event, not one per re-check
            assert replicas(emu) == 2
            # Re-checked while refused (the retries count up), and still refused.
            await wait_until(
                lambda: tries(emu, "SegtxnCluster", "demo", "reconcile_cluster.spec") >= 2,
                timeout=WAIT_S,
                what="the guard checking again",
            )
            assert replicas(emu) == 2
            assert [r for _, r, _ in emu.events("demo")].count("ScaleDownRefused") == 1

            # The topic gone, demo-broker-1 holds nothing: the next check lets it go.
            await client.admin.delete_topic("topic://acme/ops/scale")
            await wait_until(
                lambda: replicas(emu) == 1, timeout=WAIT_S, what="scaled down once empty"
            )
            await wait_until(
                lambda: (applied(emu, "SegtxnCluster", "demo") or {}).get("status") == "True",
                timeout=WAIT_S,
                what="Applied True again",
            )
            assert any(
                reason == "ScaleDown" and "demo-broker-1 hold no topics" in message
                for _, reason, message in emu.events("demo")
            )
    finally:
        second.stop()


def replicas(emu: Emulator) -> int | None:
    sts = emu.get("apps/v1/statefulsets", "demo-broker")
    return None if sts is None else int(sts["spec"]["replicas"])


async def test_a_failed_apply_says_so_in_status_and_heals(shared_local: Local) -> None:
    """The API server fails to take one of the children: the cluster's Applied condition
    turns False with the failure (before, it stayed as it was), and True once it takes it."""
    async with emulator() as emu, operator(emu, shared_local.memo()):
        emu.failing = {"policy/v1/poddisruptionbudgets": 500}
        await cluster(emu, shared_local)
        await wait_until(
            lambda: (applied(emu, "SegtxnCluster", "demo") or {}).get("reason") == "ApplyFailed",
            timeout=WAIT_S,
            what="Applied False: the apply failed",
        )
        failed = applied(emu, "SegtxnCluster", "demo")
        assert failed is not None and failed["status"] == "False"
        assert "applying PodDisruptionBudget demo-broker: HTTP 500" in failed["message"]
        assert failed["observedGeneration"] == 1
        await wait_until(  # events are posted through Kopf's queue: after the status
            lambda: any(
                (kind, reason) == ("Warning", "ApplyFailed")
                for kind, reason, _ in emu.events("demo")
            ),
            timeout=WAIT_S,
            what="the ApplyFailed Warning event",
        )
        emu.failing = {}
        await wait_until(
            lambda: (applied(emu, "SegtxnCluster", "demo") or {}).get("status") == "True",
            timeout=WAIT_S,
            what="Applied True once the API server takes every child",
        )
        assert emu.get("policy/v1/poddisruptionbudgets", "demo-broker") is not None
