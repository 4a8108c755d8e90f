"""What a VerificationRun may ask of the pod the operator creates for it
(segtxn/operator/sparkpolicy.py): a service account from the allow-list and never the
operator's own, an image under an allowed prefix, no sparkConf key that changes what code
runs or as whom. A refused run fails with a Warning event and no pod; an allowed one is
launched as before. The chart passes its service account and image repository as the
flags, and the operator's own service account through the downward API."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import kopf
import pytest
from click.testing import CliRunner

from segtxn.cli.operator import operator as operator_command
from segtxn.operator.handlers import OperatorConfig
from segtxn.operator.sparkpolicy import RunRefused, SparkPolicy, check, image_allowed
from tests.manifests.support import helm, template
from tests.operator.emulator import emulator, operator
from tests.operator.support import WAIT_S, status
from tests.operator.test_sparkapp import spec
from tests.waiting import wait_until

__all__ = ["helm"]  # the fixture

pytestmark = pytest.mark.timeout(120)
Helm = Callable[..., str]
POLICY = SparkPolicy(operator_service_account="rel-segtxn-operator")


def refused(policy: SparkPolicy = POLICY, **fields: Any) -> RunRefused:
    with pytest.raises(RunRefused) as caught:
        check(spec(**fields), policy)
    return caught.value


def test_the_default_run_is_allowed() -> None:
    check(spec(), POLICY)  # segtxn-verify:0.1.0 as segtxn-spark
    check(spec(sparkConf={"spark.executor.memory": "4g", "spark.sql.shuffle.partitions": "8"}),
          POLICY)  # fmt: skip


def test_a_service_account_not_listed_or_the_operators_own_is_refused() -> None:
    e = refused(serviceAccountName="default")
    assert e.reason == "ServiceAccountNotAllowed"
    assert "'default' is not allowed" in str(e) and "segtxn-spark" in str(e)
    # Listed by mistake, the operator's own is still refused.
    listed = SparkPolicy(service_accounts=frozenset({"segtxn-spark", "rel-segtxn-operator"}),
                         operator_service_account="rel-segtxn-operator")  # fmt: skip
    assert refused(listed, serviceAccountName="rel-segtxn-operator").reason == (
        "ServiceAccountNotAllowed"
    )


@pytest.mark.parametrize(
    "image",
    [
        "attacker.example/anything:latest",
        "segtxn.attacker.example/x:1",  # another registry whose name starts alike
        "segtxn-x/evil:1",  # another Docker Hub account
        "busybox",
        "",
    ],
)
def test_an_image_outside_the_prefixes_is_refused(image: str) -> None:
    e = refused(image=image)
    assert e.reason == "ImageNotAllowed" and "--spark-image-prefix" in str(e)


@pytest.mark.parametrize(
    ("image", "prefix", "allowed"),
    [
        ("segtxn-verify:0.1.0", "segtxn", True),
        ("segtxn@sha256:abc", "segtxn", True),
        ("ghcr.io/acme/segtxn-verify:1", "ghcr.io/acme/segtxn", True),
        ("ghcr.io/acme/other/x:1", "ghcr.io/acme/", True),
        ("localhost:5000/segtxn-verify:1", "localhost:5000/segtxn", True),
        ("ghcr.io/acme/segtxn/evil:1", "ghcr.io/acme/segtxn", False),
        ("ghcr.io/acmeevil/x:1", "ghcr.io/acme/", False),
        ("ghcr.io/acme/", "ghcr.io/acme/", False),
    ],
)
def test_image_prefixes(image: str, prefix: str, allowed: bool) -> None:
    assert image_allowed(image, prefix) is allowed


@pytest.mark.parametrize(
    "key",
    [
        "spark.jars",
        "spark.jars.packages",
        "spark.jars.repositories",
        "spark.packages",
        "spark.repositories",
        "spark.plugins",
        "spark.executor.plugins",
        "spark.files",
        "spark.archives",
        "spark.submit.pyFiles",
        "spark.kubernetes.executor.secrets.segtxn-etcd-ca",
        "spark.kubernetes.driver.secretKeyRef.TOKEN",
        "spark.kubernetes.executor.podTemplateFile",
        "spark.kubernetes.driver.podTemplateFile",
        "spark.kubernetes.authenticate.driver.serviceAccountName",
        "spark.kubernetes.authenticate.executor.serviceAccountName",
        "spark.kubernetes.authenticate.oauthToken",
        "spark.driver.extraJavaOptions",
        "spark.executor.extraJavaOptions",
        "spark.executor.extraClassPath",
        "spark.driver.extraLibraryPath",
        "spark.executorEnv.JAVA_TOOL_OPTIONS",
        "spark.kubernetes.container.image",
        "spark.kubernetes.executor.container.image",
        "spark.kubernetes.executor.volumes.hostPath.root.mount.path",
        "spark.kubernetes.namespace",
        "spark.pyspark.python",
        "spark.executor.resource.gpu.discoveryScript",
        "SPARK.JARS",  # keys are compared case-blind
    ],
)
def test_spark_conf_that_changes_code_or_identity_is_refused(key: str) -> None:
    e = refused(sparkConf={key: "x", "spark.executor.memory": "4g"})
    assert e.reason == "SparkConfNotAllowed" and key in str(e)


def memo(policy: SparkPolicy = POLICY) -> kopf.Memo:
    nowhere = "http://127.0.0.1:1"
    return kopf.Memo(config=OperatorConfig(broker_url=nowhere, coordinator_url=nowhere,
                                           verification_poll_s=0.1, spark=policy))  # fmt: skip


async def test_a_refused_run_fails_with_a_warning_and_no_pod_an_allowed_one_launches() -> None:
    asked: dict[str, dict[str, Any]] = {
        "as-operator": {"serviceAccountName": "rel-segtxn-operator"},
        "foreign-image": {"image": "attacker.example/anything:latest"},
        "jars": {"sparkConf": {"spark.jars": "https://attacker.example/x.jar"}},
    }
    reasons = {"as-operator": "ServiceAccountNotAllowed", "foreign-image": "ImageNotAllowed",
               "jars": "SparkConfNotAllowed"}  # fmt: skip
    async with emulator() as emu, operator(emu, memo()):
        await emu.create("SegtxnCluster", "demo", {"metadataStore": {"url": "etcd://e:2379/v"}})
        # Its first status tick done (the allowed run needs the cluster; an operator stopped
        # in the middle of a cluster's first tick waits a retry delay to stop).
        await wait_until(lambda: status(emu, "SegtxnCluster", "demo").get("phase") is not None,
                         timeout=WAIT_S, what="the cluster's status")  # fmt: skip
        await emu.create("VerificationRun", "allowed", {"clusterRef": "demo"})
        await wait_until(lambda: status(emu, "VerificationRun", "allowed").get("phase")
                         == "Pending", timeout=WAIT_S, what="the allowed run launched")  # fmt: skip
        pod = emu.get("v1/pods", "allowed-driver")
        assert pod is not None and pod["spec"]["serviceAccountName"] == "segtxn-spark"
        for name, fields in asked.items():
            await emu.create("VerificationRun", name, {"clusterRef": "demo", **fields})
        for name, why in reasons.items():

            def failed(name: str = name) -> bool:
                return status(emu, "VerificationRun", name).get("phase") == "Failed"

            def warned(name: str = name, why: str = why) -> bool:
                return any((kind, r) == ("Warning", why) for kind, r, _ in emu.events(name))

            await wait_until(failed, timeout=WAIT_S, what=f"{name} refused")
            assert status(emu, "VerificationRun", name)["reason"] == why
            await wait_until(warned, timeout=WAIT_S, what=f"{name}'s Warning event")
            assert emu.get("v1/pods", f"{name}-driver") is None
            assert emu.get("v1/configmaps", f"{name}-spark") is None


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """``segtxn operator`` parsed by the real CLI, ``kopf.run`` recorded, not run."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(kopf, "run", lambda **kwargs: calls.append(kwargs))
    module = importlib.import_module("segtxn.cli.operator")
    monkeypatch.setattr(module, "_quiet_start_up_failures", lambda: None)
    return calls


def chart_policy(helm: Helm, runs: list[dict[str, Any]], *sets: str) -> SparkPolicy:
    """The policy the operator the chart renders starts with (its args and env)."""
    (deployment,) = [d for d in template(helm, *sets) if d["kind"] == "Deployment"
                     and d["metadata"]["name"].endswith("-operator")]  # fmt: skip
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    [own] = [e for e in container["env"] if e["name"] == "SEGTXN_OPERATOR_SERVICE_ACCOUNT"]
    assert own["valueFrom"] == {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}
    args = [a for a in container["args"] if a not in ("-v", "-vv")][1:]  # after `operator`
    done = CliRunner().invoke(operator_command, [*args, "--standalone"],
                              env={own["name"]: pod["serviceAccountName"]})  # fmt: skip
    assert done.exit_code == 0, done.output
    policy = runs.pop()["memo"]["config"].spark
    assert isinstance(policy, SparkPolicy)
    return policy


def test_the_chart_passes_its_service_account_and_image_repository(
    helm: Helm, runs: list[dict[str, Any]]
) -> None:
    policy = chart_policy(helm, runs)
    assert policy.service_accounts == {"segtxn-spark"}
    assert policy.image_prefixes == ("segtxn",)
    assert policy.operator_service_account == "rel-segtxn-operator"
    check(spec(), policy)  # the CRD's default image and account

    policy = chart_policy(helm, runs, "image.repository=ghcr.io/acme/segtxn",
                          "spark.serviceAccount.name=spark-a",
                          "spark.extraServiceAccounts={spark-b}")  # fmt: skip
    assert policy.service_accounts == {"spark-a", "spark-b"}
    assert policy.image_prefixes == ("ghcr.io/acme/segtxn",)
    policy = chart_policy(helm, runs, "spark.imagePrefixes={registry.example/verify/}")
    assert policy.image_prefixes == ("registry.example/verify/",)


def test_the_operators_own_account_or_an_empty_prefix_cannot_be_allowed(
    runs: list[dict[str, Any]],
) -> None:
    args = ["--standalone", "-n", "segtxn", "--spark-service-account=segtxn-operator"]
    own = {"SEGTXN_OPERATOR_SERVICE_ACCOUNT": "segtxn-operator"}
    done = CliRunner().invoke(operator_command, args, env=own)
    assert done.exit_code == 2 and "the operator's own service account" in done.output
    done = CliRunner().invoke(operator_command, ["--standalone", "-A", "--spark-image-prefix="])
    assert done.exit_code == 2 and "would allow every image" in done.output
    assert runs == []
