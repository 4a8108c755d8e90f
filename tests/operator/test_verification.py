"""A VerificationRun's life through the operator (Kopf against kmock; no segtxn processes,
no Spark): created, the driver pod and executor template applied as its children, then
Running, then Succeeded or Failed with the verdict the checker publishes (through
:mod:`segtxn.verify.publish`, over HTTP to the emulated API server, as the driver does)
in its status and events; a run that cannot be checked says why; a deleted run leaves
only objects Kubernetes' garbage collector removes with it.

The test plays the kubelet (the driver pod's status) and the driver (the report): no
kubelet or Spark runs here (e2e/ runs the real thing on kind)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import kopf
import pytest

from segtxn.operator.handlers import OperatorConfig
from segtxn.verify.checker import Report
from segtxn.verify.publish import Api, PublishError, Target, config_map, publish, verdict
from tests.operator.emulator import NS, Emulator, emulator, operator
from tests.operator.support import WAIT_S, status
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)
PODS = "v1/pods"
CONFIGMAPS = "v1/configmaps"
NOWHERE = "http://127.0.0.1:1"


def memo() -> kopf.Memo:
    return kopf.Memo(
        config=OperatorConfig(broker_url=NOWHERE, coordinator_url=NOWHERE, verification_poll_s=0.1)
    )


async def started(emu: Emulator, name: str, **spec: Any) -> dict[str, Any]:
    """A run created on cluster ``demo`` and launched (its driver pod applied)."""
    if emu.mine("SegtxnCluster", "demo") is None:
        await emu.create("SegtxnCluster", "demo", {"metadataStore": {"url": "etcd://e:2379/v"}})
    run = await emu.create("VerificationRun", name, {"clusterRef": "demo", **spec})
    await wait_until(
        lambda: status(emu, "VerificationRun", name).get("phase") is not None,
        timeout=WAIT_S,
        what=f"run {name} launched",
    )
    return run


async def kubelet(emu: Emulator, pod: str, pod_status: dict[str, Any]) -> None:
    code, body = await emu.call(
        "PATCH", f"/api/v1/namespaces/{NS}/pods/{pod}/status", {"status": pod_status}
    )
    assert code == 200, body


def running(name: str) -> dict[str, Any]:
    return {"name": name, "state": {"running": {"startedAt": "2026-11-26T10:00:00Z"}}}


def exited(name: str, code: int, message: str = "") -> dict[str, Any]:
    return {"name": name, "state": {"terminated": {"exitCode": code, "message": message}}}


async def driver_publishes(
    emu: Emulator, run: dict[str, Any], counts: dict[str, int], tmp: Path
) -> None:
    """What ``segtxn verify check --report-configmap`` does at the end, against the
    emulated API server: the same body, the same server-side apply."""
    meta = run["metadata"]
    owner = {
        "apiVersion": run["apiVersion"],
        "kind": "VerificationRun",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    target = Target(NS, f"{meta['name']}-report", owner)
    report = Report(counts=counts, samples={})
    html = tmp / "report.html"
    html.write_text("<html><body>the report</body></html>")
    body = config_map(target, verdict(report, drained=True), "summary", html.read_text(), html)
    # blocking, as in the driver: in a thread, the emulator answers on this loop
    await asyncio.to_thread(publish, Api(str(emu.url).rstrip("/"), "a-token"), target, body)


async def posted(emu: Emulator, name: str, event: tuple[str, str, str]) -> None:
    """Kopf posts events from a queue of its own: wait for this one."""
    await wait_until(lambda: event in emu.events(name), timeout=WAIT_S, what=f"event {event}")


def owned_by(emu: Emulator, uid: str) -> set[tuple[str, str]]:
    """(kind, name) of every live object whose owner is ``uid``: what Kubernetes' garbage
    collector deletes with it (the emulator has none)."""
    return {
        (o.raw["kind"], o.raw["metadata"]["name"])
        for o in list(emu.objects.values())
        if not o.deleted
        and any(r.get("uid") == uid for r in o.raw.get("metadata", {}).get("ownerReferences", []))
    }


async def test_a_run_goes_from_launched_to_running_to_failed_with_its_anomalies(
    tmp_path: Path,
) -> None:
    async with emulator() as emu, operator(emu, memo()):
        run = await started(emu, "r1", executors={"instances": 3})
        uid = run["metadata"]["uid"]
        pod = emu.get(PODS, "r1-driver")
        assert pod is not None and emu.get(CONFIGMAPS, "r1-spark") is not None
        [owner] = pod["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"], owner["controller"]) == ("VerificationRun", uid, True)
        got = status(emu, "VerificationRun", "r1")
        assert got["driverPod"] == "r1-driver" and got["reportConfigMap"] == "r1-report"
        assert got["report"] == (
            f"kubectl -n {NS} get configmap r1-report -o "
            "jsonpath='{.data.report\\.html}' > report.html"
        )
        await wait_until(
            lambda: any(r == "Launched" and "3 executors" in m for _, r, m in emu.events("r1")),
            timeout=WAIT_S,
            what="the Launched event",
        )

        await kubelet(
            emu, "r1-driver", {"phase": "Pending", "initContainerStatuses": [running("workload")]}
        )
        await wait_until(
            lambda: status(emu, "VerificationRun", "r1").get("reason") == "Workload",
            timeout=WAIT_S,
            what="the workload running",
        )
        assert status(emu, "VerificationRun", "r1")["phase"] == "Running"
        await kubelet(
            emu,
            "r1-driver",
            {
                "phase": "Running",
                "initContainerStatuses": [exited("workload", 0)],
                "containerStatuses": [running("driver")],
            },
        )
        await wait_until(
            lambda: status(emu, "VerificationRun", "r1").get("reason") == "Checking",
            timeout=WAIT_S,
            what="the check running",
        )

        await driver_publishes(
            emu, run, {"duplicate": 2, "lost_write": 1, "order_violation": 0}, tmp_path
        )
        await wait_until(
            lambda: status(emu, "VerificationRun", "r1").get("phase") == "Failed",
            timeout=WAIT_S,
            what="the verdict in status",
        )
        got = status(emu, "VerificationRun", "r1")
        assert (got["reason"], got["verdict"], got["anomalies"]) == ("AnomaliesFound", "Failed", 3)
        assert got["anomalyCounts"] == {"duplicate": 2, "lost_write": 1, "order_violation": 0}
        assert got["message"] == "3 anomalies (duplicate 2, lost_write 1)"
        assert "completionTime" in got
        event = f"{got['message']}; report: {got['report']}"  # the verdict says where it is
        await posted(emu, "r1", ("Warning", "AnomaliesFound", event))
        report = emu.get(CONFIGMAPS, "r1-report")
        assert report is not None and "the report" in report["data"]["report.html"]
        assert report["metadata"]["labels"]["segtxn.io/verification-run"] == "r1"

        # Finished is final: the pod ending afterwards changes nothing.
        await kubelet(
            emu, "r1-driver", {"phase": "Failed", "containerStatuses": [exited("driver", 1)]}
        )
        patches = len([e for e in emu.events("r1") if e[1] != "Launched"])
        await emu.delete("VerificationRun", "r1")
        await wait_until(
            lambda: emu.mine("VerificationRun", "r1") is None,
            timeout=WAIT_S,
            what="the run deleted (its finalizer released)",
        )
        assert len([e for e in emu.events("r1") if e[1] != "Launched"]) == patches
        # Everything the run made goes with it; Spark's executor pods are the driver pod's.
        assert owned_by(emu, uid) == {
            ("Pod", "r1-driver"),
            ("ConfigMap", "r1-spark"),
            ("ConfigMap", "r1-report"),
        }
        args = pod["spec"]["containers"][0]["args"]
        assert "spark.kubernetes.driver.pod.name=r1-driver" in args


async def test_a_clean_run_succeeds(tmp_path: Path) -> None:
    async with emulator() as emu, operator(emu, memo()):
        run = await started(emu, "clean")
        await kubelet(
            emu, "clean-driver", {"phase": "Running", "containerStatuses": [running("driver")]}
        )
        await driver_publishes(emu, run, {"duplicate": 0}, tmp_path)
        await wait_until(
            lambda: status(emu, "VerificationRun", "clean").get("phase") == "Succeeded",
            timeout=WAIT_S,
            what="the run passed",
        )
        got = status(emu, "VerificationRun", "clean")
        assert (got["verdict"], got["anomalies"], got["reason"]) == ("Passed", 0, "Passed")
        event = f"no anomaly; every input consumed; report: {got['report']}"
        await posted(emu, "clean", ("Normal", "Passed", event))


async def test_a_run_that_cannot_be_checked_fails_saying_why() -> None:
    async with emulator() as emu, operator(emu, memo()):
        await started(emu, "broken")
        log_tail = "cannot reach the brokers at http://demo-broker.segtxn.svc:8080"
        await kubelet(
            emu,
            "broken-driver",
            {
                "phase": "Failed",
                "initContainerStatuses": [exited("workload", 1, log_tail)],
                "containerStatuses": [{"name": "driver", "state": {"waiting": {}}}],
            },
        )
        await wait_until(
            lambda: status(emu, "VerificationRun", "broken").get("phase") == "Failed",
            timeout=WAIT_S,
            what="the run failed",
        )
        got = status(emu, "VerificationRun", "broken")
        assert got["reason"] == "WorkloadFailed" and "verdict" not in got
        assert got["message"] == f"container workload exited 1: {log_tail}"

        await started(emu, "vanished")
        await emu.call("DELETE", f"/api/v1/namespaces/{NS}/pods/vanished-driver")
        await wait_until(
            lambda: status(emu, "VerificationRun", "vanished").get("reason") == "DriverGone",
            timeout=WAIT_S,
            what="the lost driver noticed",
        )


async def test_a_run_on_a_missing_cluster_waits_and_a_bad_name_fails() -> None:
    async with emulator() as emu, operator(emu, memo()):
        await emu.create("VerificationRun", "early", {"clusterRef": "later"})
        await emu.create("VerificationRun", "x" * 41, {"clusterRef": "later"})
        long = "x" * 41
        await wait_until(
            lambda: status(emu, "VerificationRun", long).get("phase") == "Failed",
            timeout=WAIT_S,
            what="the bad name refused",
        )
        assert status(emu, "VerificationRun", long)["reason"] == "InvalidName"
        assert emu.get(PODS, f"{long}-driver") is None
        # The cluster appears: the waiting run is launched.
        assert emu.get(PODS, "early-driver") is None and not status(emu, "VerificationRun", "early")
        await emu.create("SegtxnCluster", "later", {"metadataStore": {"url": "etcd://e:2379/v"}})
        await wait_until(
            lambda: emu.get(PODS, "early-driver") is not None,
            timeout=WAIT_S,
            what="the run launched once its cluster exists",
        )
        init = emu.get(PODS, "early-driver")
        assert init is not None
        args = init["spec"]["initContainers"][0]["args"]
        assert "--url=http://later-broker.segtxn.svc:8080" in args


async def test_publishing_refused_by_the_api_server_is_an_error_naming_it(tmp_path: Path) -> None:
    async with emulator() as emu:
        emu.failing = {CONFIGMAPS: 403}
        target = Target(NS, "r-report", {"apiVersion": "v1", "kind": "X", "name": "r", "uid": "u"})
        body = config_map(target, {"passed": True}, "s", "<html/>", tmp_path / "report.html")
        with pytest.raises(PublishError, match="r-report: HTTP 403"):
            await asyncio.to_thread(publish, Api(str(emu.url).rstrip("/"), "t"), target, body)
    with pytest.raises(PublishError, match="SEGTXN_REPORT_OWNER"):
        Target.from_env("r-report", {"SEGTXN_REPORT_NAMESPACE": NS})
    with pytest.raises(PublishError, match="ownerReference"):
        Target.from_env("r-report", {"SEGTXN_REPORT_NAMESPACE": NS, "SEGTXN_REPORT_OWNER": "{}"})
    with pytest.raises(PublishError, match="not in a Kubernetes pod"):
        Api.in_cluster({})
