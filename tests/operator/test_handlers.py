"""The Kopf handlers end to end: Kopf against kmock's Kubernetes emulator, the handlers
talking to a real segtxn cluster (broker and coordinator processes on a real etcd)."""

from __future__ import annotations

from pathlib import Path

import pytest

from segtxn.client import Client, ServerError
from segtxn.operator.handlers import FINALIZER
from segtxn.operator.render import CONFIG_HASH
from segtxn.protocol.errors import ErrorName
from tests.operator.emulator import emulator, operator
from tests.operator.support import (
    WAIT_S,
    Local,
    cluster,
    condition,
    config_of,
    orders,
    status,
    tries,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(180)
TOPIC = {"clusterRef": "demo", "tenant": "acme", "namespace": "ops", "topic": "orders"}
TOPIC_NAME = "topic://acme/ops/orders"


async def test_cluster_children_status_and_update(shared_local: Local) -> None:
    async with emulator() as emu, operator(emu, shared_local.memo()):
        await cluster(emu, shared_local, replicas=3)
        created = emu.mine("SegtxnCluster", "demo")
        assert created is not None
        await wait_until(
            lambda: (
                emu.get("apps/v1/statefulsets", "demo-broker") is not None
                and condition(emu, "SegtxnCluster", "demo", "Applied") == "True"
            ),
            timeout=WAIT_S,
            what="the cluster's children applied",
        )
        uid = created["metadata"]["uid"]
        used = config_of(emu)
        assert used is not None
        for resource, name in (
            ("v1/configmaps", used["metadata"]["name"]),
            ("v1/services", "demo-broker"),
            ("v1/services", "demo-broker-headless"),
            ("apps/v1/statefulsets", "demo-broker"),
            ("policy/v1/poddisruptionbudgets", "demo-broker"),
        ):
            child = emu.get(resource, name)
            assert child is not None, name
            owner = child["metadata"]["ownerReferences"][0]
            assert (owner["kind"], owner["uid"], owner["controller"]) == (
                "SegtxnCluster",
                uid,
                True,
            )
        live = emu.mine("SegtxnCluster", "demo")
        assert live is not None and FINALIZER in live["metadata"]["finalizers"]
        assert status(emu, "SegtxnCluster", "demo")["serviceUrl"] == (
            "http://demo-broker.segtxn.svc:8080"
        )
        await wait_until(
            lambda: ("Normal", "Applied", "5 objects applied") in emu.events("demo"),
            timeout=WAIT_S,
            what="the Applied event",
        )

        # The StatefulSet controller (absent here) reports three ready pods, but it has not
        # acted on the latest generation yet: a rollout in progress is not Ready.
        sts_path = "/apis/apps/v1/namespaces/segtxn/statefulsets/demo-broker"
        await emu.call("PATCH", sts_path, {"metadata": {"generation": 2}})
        pods = {"readyReplicas": 3, "replicas": 3, "updatedReplicas": 3}
        await emu.call("PATCH", sts_path + "/status", {"status": {**pods, "observedGeneration": 1}})

        def ready_reason() -> str | None:
            found = [
                c for c in status(emu, "SegtxnCluster", "demo").get("conditions", [])
                if c["type"] == "Ready"
            ]  # fmt: skip
            return str(found[0]["reason"]) if found else None

        await wait_until(
            lambda: ready_reason() == "RollingOut", timeout=WAIT_S, what="Ready False: rolling"
        )
        assert condition(emu, "SegtxnCluster", "demo", "Ready") == "False"
        assert status(emu, "SegtxnCluster", "demo")["phase"] == "Updating"
        # Now it has: the cluster is Ready.
        await emu.call("PATCH", sts_path + "/status", {"status": {**pods, "observedGeneration": 2}})
        await wait_until(
            lambda: status(emu, "SegtxnCluster", "demo").get("phase") == "Ready",
            timeout=WAIT_S,
            what="phase Ready",
        )
        assert status(emu, "SegtxnCluster", "demo")["readyBrokers"] == 3
        ready = next(
            c for c in status(emu, "SegtxnCluster", "demo")["conditions"] if c["type"] == "Ready"
        )
        assert ready["status"] == "True"
        assert ready["observedGeneration"] == 1  # the cluster's spec was never changed

        # A new setting reaches the ConfigMap and rolls the pods (the template's hash).
        sts = emu.get("apps/v1/statefulsets", "demo-broker")
        assert sts is not None
        before = sts["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH]
        await emu.patch(
            "SegtxnCluster", "demo", {"spec": {"brokers": {"replicas": 5, "settings": {
                "consumerHoldSeconds": 3}}}},
        )  # fmt: skip

        def updated() -> bool:
            s = emu.get("apps/v1/statefulsets", "demo-broker") or {}
            return bool(
                s["spec"]["replicas"] == 5
                and s["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH] != before
            )

        await wait_until(updated, timeout=WAIT_S, what="the update applied")
        config = config_of(emu)
        assert config is not None and config["data"]["consumerHoldSeconds"] == "3"
        # Five brokers asked for, three running the old template: not Ready any more. A
        # status tick working from what it read before the update may first write Ready
        # False NotApplied (spec and StatefulSet not matching; on a busy machine the test
        # once read that one): the next tick sees the new template rolling out.
        await wait_until(
            lambda: (
                condition(emu, "SegtxnCluster", "demo", "Ready") == "False"
                and ready_reason() == "RollingOut"
            ),
            timeout=WAIT_S,
            what="Ready False, RollingOut, during the rollout",
        )
        conditions = status(emu, "SegtxnCluster", "demo")["conditions"]
        assert {c["type"]: c["observedGeneration"] for c in conditions} == {
            "Applied": 2,
            "Ready": 2,
        }


async def test_topic_created_split_merged_and_deleted_through_the_brokers(
    shared_local: Local,
) -> None:
    spec, name = orders("split-merge")
    async with (
        emulator() as emu,
        operator(emu, shared_local.memo()),
        Client(shared_local.broker.url) as client,
    ):
        await cluster(emu, shared_local)
        await emu.create("ScalableTopic", "orders", {**spec, "initialSegments": 2})
        await wait_until(
            lambda: status(emu, "ScalableTopic", "orders").get("activeSegments") == 2,
            timeout=WAIT_S,
            what="the topic created",
        )
        assert (await client.admin.stats(name))["activeSegments"] == 2
        await wait_until(
            lambda: ("Normal", "Created", f"{name} created") in emu.events("orders"),
            timeout=WAIT_S,
            what="the Created event",
        )

        # Split while a transaction is open on the topic: it still commits, and its
        # message is read back.
        producer = await client.create_producer(name)
        async with client.transaction() as txn:
            await producer.send(b"in-flight", key="k1", txn=txn)
            await emu.patch("ScalableTopic", "orders", {"spec": {"targetSegments": 4}})
            await wait_until(
                lambda: (
                    status(emu, "ScalableTopic", "orders").get("sealedSegments") == 2
                    and status(emu, "ScalableTopic", "orders").get("activeSegments") == 4
                ),
                timeout=WAIT_S,
                what="split to 4 active segments",
            )
        reader = await client.subscribe(name, "check", initial_position="earliest")
        assert (await reader.receive(timeout_s=10)).value == b"in-flight"

        seen = status(emu, "ScalableTopic", "orders")
        truth = await client.admin.stats(name)
        assert [(s["id"], s["state"], s["range"]) for s in seen["segments"]] == [
            (s["id"], s["state"], s["range"]) for s in truth["segments"]
        ]
        assert seen["epoch"] == truth["epoch"]
        await wait_until(
            lambda: [r for _, r, _ in emu.events("orders")].count("Resharded") == 2,
            timeout=WAIT_S,
            what="two Resharded events",
        )
        assert condition(emu, "ScalableTopic", "orders", "Ready") == "True"

        await emu.patch("ScalableTopic", "orders", {"spec": {"targetSegments": 3}})
        await wait_until(
            lambda: status(emu, "ScalableTopic", "orders").get("activeSegments") == 3,
            timeout=WAIT_S,
            what="merged to 3",
        )
        assert (await client.admin.stats(name))["activeSegments"] == 3

        await reader.close()
        await producer.close()
        await emu.delete("ScalableTopic", "orders")
        await wait_until(
            lambda: emu.mine("ScalableTopic", "orders") is None,
            timeout=WAIT_S,
            what="the resource gone",
        )
        with pytest.raises(ServerError) as refused:
            await client.admin.stats(name)
        assert refused.value.name is ErrorName.TOPIC_NOT_FOUND


async def test_cluster_deletion_waits_for_its_topics(shared_local: Local) -> None:
    spec, _ = orders("cluster-deletion")
    async with emulator() as emu, operator(emu, shared_local.memo()):
        await cluster(emu, shared_local)
        await emu.create("ScalableTopic", "orders", spec)
        await wait_until(
            lambda: status(emu, "ScalableTopic", "orders").get("activeSegments") == 1,
            timeout=WAIT_S,
            what="the topic created",
        )
        await emu.delete("SegtxnCluster", "demo")
        await wait_until(
            lambda: status(emu, "SegtxnCluster", "demo").get("phase") == "Deleting",
            timeout=WAIT_S,
            what="the cluster waiting",
        )
        live = emu.mine("SegtxnCluster", "demo")
        assert live is not None and live["metadata"].get("deletionTimestamp")
        await emu.delete("ScalableTopic", "orders")
        await wait_until(
            lambda: emu.mine("SegtxnCluster", "demo") is None,
            timeout=WAIT_S,
            what="the cluster released once its topic is gone",
        )


async def test_topic_waits_for_brokers_and_converges_when_they_come(local: Local) -> None:
    local.broker.kill()
    async with emulator() as emu, operator(emu, local.memo()):
        await cluster(emu, local)
        await emu.create("ScalableTopic", "orders", {**TOPIC, "targetSegments": 2})

        # Status says why, and Kopf retries (its progress annotation counts the tries).
        def retried() -> bool:
            reasons = [
                c["reason"]
                for c in status(emu, "ScalableTopic", "orders").get("conditions", [])
                if c["type"] == "Ready" and c["status"] == "False"
            ]
            return tries(emu, "ScalableTopic", "orders", "reconcile_topic") >= 2 and reasons == [
                "ServiceNotReady"
            ]

        await wait_until(retried, timeout=WAIT_S, what="the handler retrying")
        assert status(emu, "ScalableTopic", "orders").get("activeSegments") is None
        local.broker.start()
        await local.broker.ready()
        await wait_until(
            lambda: status(emu, "ScalableTopic", "orders").get("activeSegments") == 2,
            timeout=WAIT_S,
            what="the topic created and split once the brokers are back",
        )


async def test_coordinator_status_and_gc_backlog_condition(local: Local, tmp_path: Path) -> None:
    async with emulator() as emu, operator(emu, local.memo()):
        # Created before its cluster: it waits for it.
        await emu.create(
            "TransactionCoordinator",
            "demo",
            {"clusterRef": "demo", "statusIntervalSeconds": 1, "gcBacklogThreshold": 0},
        )
        await wait_until(
            lambda: tries(emu, "TransactionCoordinator", "demo", "reconcile_coordinator") >= 1,
            timeout=WAIT_S,
            what="the coordinators waiting for their cluster",
        )
        assert emu.get("apps/v1/deployments", "demo-coordinator") is None
        await cluster(emu, local)
        await wait_until(
            lambda: emu.get("apps/v1/deployments", "demo-coordinator") is not None,
            timeout=WAIT_S,
            what="the coordinators rendered once the cluster exists",
        )
        await wait_until(
            lambda: condition(emu, "TransactionCoordinator", "demo", "Reachable") == "True",
            timeout=WAIT_S,
            what="the coordinators' counts read",
        )
        assert len(status(emu, "TransactionCoordinator", "demo")["idsHeld"]) == 4

        # The coordinators answer, but no controller here ever rolled the Deployment out
        # (its status tick may have read it before it existed: Missing, then RollingOut).
        def ready() -> tuple[str, str] | None:
            found = [
                (str(c["status"]), str(c["reason"]))
                for c in status(emu, "TransactionCoordinator", "demo")["conditions"]
                if c["type"] == "Ready"
            ]
            return found[0] if found else None

        await wait_until(
            lambda: ready() == ("False", "RollingOut"),
            timeout=WAIT_S,
            what="Ready False: the Deployment never rolled out",
        )

        async with Client(local.broker.url) as client:
            await client.admin.create_topic(TOPIC_NAME, segments=2)
            producer = await client.create_producer(TOPIC_NAME)
            txn = await client.transaction(timeout_s=120).start()
            await producer.send(b"x", key="k", txn=txn)
            await wait_until(
                lambda: status(emu, "TransactionCoordinator", "demo").get("openTransactions") == 1,
                timeout=WAIT_S,
                what="the open transaction counted",
            )
            # The participant dies before it can clean up: the commit leaves op records.
            local.broker.kill()
            await txn.commit()
        await wait_until(
            lambda: (
                (status(emu, "TransactionCoordinator", "demo").get("gcBacklog") or 0) > 0
                and condition(emu, "TransactionCoordinator", "demo", "GCBacklogHigh") == "True"
            ),
            timeout=WAIT_S,
            what="the GC backlog reported",
        )
        assert status(emu, "TransactionCoordinator", "demo")["openTransactions"] == 0
        await wait_until(
            lambda: any(
                kind == "Warning" and reason == "GCBacklogHigh"
                for kind, reason, _ in emu.events("demo")
            ),
            timeout=WAIT_S,
            what="a GCBacklogHigh warning",
        )
        # Back, the broker materializes the decision and deletes its op records.
        local.broker.start()
        await local.broker.ready()
        async with Client(local.broker.url) as client:
            await client.admin.stats(TOPIC_NAME)  # loads the segments
        await wait_until(
            lambda: (
                status(emu, "TransactionCoordinator", "demo").get("gcBacklog") == 0
                and condition(emu, "TransactionCoordinator", "demo", "GCBacklogHigh") == "False"
            ),
            timeout=WAIT_S,
            what="the backlog drained",
        )
