"""A running cluster changed through its SegtxnCluster: upgrades reach every child, and
what must not change is refused whole (Kopf against kmock, real segtxn processes)."""

from __future__ import annotations

from typing import Any

import pytest

from segtxn.operator.render import CONFIG_HASH
from tests.operator.emulator import Emulator, emulator, operator
from tests.operator.support import WAIT_S, Local, cluster, status
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
    found = [c for c in status(emu, kind, name).get("conditions", []) if c["type"] == "Applied"]
    return found[0] if found else None


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


async def test_image_and_session_ttl_changes_reach_the_coordinators_too(local: Local) -> None:
    async with emulator() as emu, operator(emu, local.memo()):
        await running(emu, local)
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

        # Before the fix the coordinators kept the old image and TTL until their own spec
        # changed: only the brokers were re-rendered.
        await wait_until(everything_updated, timeout=WAIT_S, what="brokers and coordinators")
        assert config_hash(emu, "apps/v1/statefulsets", "demo-broker") != hashes["brokers"]
        config = emu.get("v1/configmaps", "demo-config")
        assert config is not None and config["data"]["sessionTtlSeconds"] == "20"
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


async def test_a_store_url_change_is_refused_whole_and_named(local: Local) -> None:
    async with emulator() as emu, operator(emu, local.memo()):
        await running(emu, local)
        # kmock does not run the CRD's CEL rule (a real API server would refuse the patch):
        # this is the operator's own defence. The image change rides along: it must not
        # be applied either (never half-applied).
        await emu.patch(
            "SegtxnCluster",
            "demo",
            {"spec": {"image": "segtxn:0.2.0", "metadataStore": {"url": local.store_url + "x"}}},
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
        config = emu.get("v1/configmaps", "demo-config")
        assert config is not None and config["data"]["storeUrl"] == local.store_url
        assert image(emu, "apps/v1/statefulsets", "demo-broker") == "segtxn:0.1.0"
        assert image(emu, "apps/v1/deployments", "demo-coordinator") == "segtxn:0.1.0"

        # The URL set back, the rest of the change goes through.
        await emu.patch("SegtxnCluster", "demo", {"spec": {"metadataStore": {
            "url": local.store_url}}})  # fmt: skip
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
