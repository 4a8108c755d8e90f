"""On kind: the operator brings the sample cluster up, splits on request, and the
transactional workload survives a split, a broker kill and a coordinator kill with zero
anomalies found by the Spark check running in the cluster."""

from __future__ import annotations

from pathlib import Path

from e2e.conftest import ROOT, Kube


def test_sample_resources_become_a_ready_cluster(kube: Kube) -> None:
    kube.wait_until(
        "SegtxnCluster demo Ready",
        lambda: kube.get("segtxncluster", "demo").get("status", {}).get("phase") == "Ready",
    )
    kube.wait_until(
        "2 ready coordinators",
        lambda: (
            kube.get("transactioncoordinator", "demo").get("status", {}).get("readyReplicas") == 2
        ),
    )
    kube.wait_until(
        "orders with 2 active segments",
        lambda: kube.get("scalabletopic", "orders").get("status", {}).get("activeSegments") == 2,
    )


def test_split_through_the_resource(kube: Kube) -> None:
    kube(
        "patch",
        "scalabletopic",
        "orders",
        "--type",
        "merge",
        "-p",
        '{"spec": {"targetSegments": 4}}',
    )

    def split() -> bool:
        status = kube.get("scalabletopic", "orders").get("status", {})
        return bool(status.get("activeSegments") == 4 and status.get("sealedSegments") == 2)

    kube.wait_until("orders split to 4 active segments, 2 sealed", split)
    events = kube("get", "events", "--field-selector", "involvedObject.name=orders")
    assert "Resharded" in events


def test_workload_survives_split_and_pod_kills_with_zero_anomalies(kube: Kube) -> None:
    job = Path(ROOT / "manifests/spark/verify-job.yaml")
    kube("delete", "job", "segtxn-verify", "--ignore-not-found")
    kube("apply", "-f", str(job))

    def workload_running() -> bool:
        pods = kube(
            "get",
            "pods",
            "-l",
            "job-name=segtxn-verify",
            "-o",
            "jsonpath={.items[*].status.initContainerStatuses[*].state.running}",
        )
        return bool(pods.strip())

    kube.wait_until("the workload to start", workload_running)
    # The workload splits and merges its own topics while transactions are open; meanwhile
    # a broker and a coordinator die without notice.
    kube("delete", "pod", "demo-broker-1", "--grace-period=0", "--force")
    coordinator = kube(
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/component=coordinator",
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ).strip()
    kube("delete", "pod", coordinator, "--grace-period=0", "--force")
    kube("wait", "--for=condition=complete", "job/segtxn-verify", "--timeout=1200s", timeout=1300)
    report = kube("logs", "job/segtxn-verify", "-c", "check")
    assert "PASS: no anomaly" in report, report


def test_a_verification_run_checks_on_two_spark_executors_and_keeps_its_report(
    kube: Kube,
) -> None:
    """The VerificationRun sample: the operator launches the workload and then spark-submit
    with --master k8s://; Spark's driver starts two executor pods (the history files are
    read on them, from the run's volume); the verdict lands in status, the HTML report in
    a ConfigMap that outlives the pods; deleting the run removes its pods."""
    sample = ROOT / "manifests/spark/verificationrun.yaml"
    kube("delete", "verificationrun", "demo-check", "--ignore-not-found", "--wait=true")
    kube("apply", "-f", str(sample))
    selector = "segtxn.io/verification-run=demo-check,spark-role=executor"

    def executors() -> int:
        names = kube("get", "pods", "-l", selector, "-o", "name").split()
        return len(names)

    kube.wait_until("two executor pods", lambda: executors() >= 2, timeout=1200)

    def finished() -> bool:
        phase = kube.get("verificationrun", "demo-check").get("status", {}).get("phase")
        return phase in ("Succeeded", "Failed")

    kube.wait_until("the run's verdict", finished, timeout=1500)
    status = kube.get("verificationrun", "demo-check")["status"]
    assert status["phase"] == "Succeeded", status
    assert (status["verdict"], status["anomalies"]) == ("Passed", 0), status
    html = kube("get", "configmap", "demo-check-report", "-o", r"jsonpath={.data.report\.html}")
    assert "<html" in html and "PASS" in kube(
        "get", "configmap", "demo-check-report", "-o", r"jsonpath={.data.report\.txt}"
    )
    events = kube("get", "events", "--field-selector", "involvedObject.name=demo-check")
    assert "Passed" in events
    kube("delete", "verificationrun", "demo-check", "--wait=true")
    kube.wait_until(
        "the run's pods and report gone",
        lambda: (
            not kube(
                "get",
                "pods,configmaps",
                "-l",
                "segtxn.io/verification-run=demo-check",
                "-o",
                "name",
            ).strip()
            and "demo-check-report" not in kube("get", "configmaps", "-o", "name")
        ),
    )
