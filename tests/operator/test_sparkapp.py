"""A VerificationRun rendered: valid Kubernetes objects (the driver pod, the executor pod
template Spark reads), Pod Security "restricted", commands the real CLI accepts, and the
chart's Spark service account with the rights Spark's driver uses."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import click
import jsonschema
import pytest
import yaml

from segtxn.cli.commands import main
from segtxn.operator import sparkapp
from segtxn.operator.sparkapp import InvalidRun, RunNames, render_run
from tests.manifests.podsecurity import violations
from tests.manifests.support import ROOT, crd_schemas, helm, template, validate
from tests.manifests.test_crds import defaulted
from tests.operator.test_render import minimal

__all__ = ["helm"]  # the fixture

Helm = Callable[..., str]
URL = "http://demo-broker.segtxn.svc:8080"
UID = "0b7c6b8e-5d0e-4c3f-9d52-1d3f8c1e2a10"


def spec(**fields: Any) -> dict[str, Any]:
    return minimal("VerificationRun", {"clusterRef": "demo", **fields})


def rendered(name: str = "r1", **fields: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the templates' ConfigMap, the driver pod)."""
    config_map, pod = render_run(name, "segtxn", UID, spec(**fields), URL)
    return config_map, pod


def cli(args: list[str]) -> dict[str, Any]:
    """``segtxn verify ...`` as the real CLI parses it: its parameters."""
    group = main.commands[args[0]]
    assert isinstance(group, click.Group)
    with group.commands[args[1]].make_context(args[1], args[2:]) as ctx:
        return dict(ctx.params)


def executor_pod(config_map: dict[str, Any]) -> dict[str, Any]:
    return dict(yaml.safe_load(config_map["data"][sparkapp.EXECUTOR_TEMPLATE]))


def test_the_run_renders_valid_restricted_objects() -> None:
    config_map, pod = rendered()
    executor = executor_pod(config_map)
    for obj in (config_map, pod, executor):
        validate(obj)
    named = {**executor, "metadata": {**executor["metadata"], "name": "an-executor"}}
    assert violations(pod) == [] and violations(named) == []
    assert [config_map["kind"], pod["kind"]] == ["ConfigMap", "Pod"]  # the template first
    assert pod["metadata"]["name"] == "r1-driver"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["serviceAccountName"] == "segtxn-spark"
    # The executors mount the driver pod's ephemeral claim, by Kubernetes' naming rule.
    [runs] = [v for v in pod["spec"]["volumes"] if v["name"] == "runs"]
    assert runs["ephemeral"]["volumeClaimTemplate"]["spec"]["accessModes"] == ["ReadWriteOnce"]
    [claim] = executor["spec"]["volumes"]
    assert claim["persistentVolumeClaim"] == {"claimName": "r1-driver-runs", "readOnly": True}
    assert RunNames("r1").claim == f"{pod['metadata']['name']}-{runs['name']}"
    [container] = executor["spec"]["containers"]
    assert container["name"] == "executor" and container["command"] == ["/opt/entrypoint.sh"]
    assert executor["spec"]["automountServiceAccountToken"] is False
    # A failed container's log tail becomes its termination message: the run's status.
    for c in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]:
        assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_the_primary_resource_is_the_segtxn_cli_and_the_image_has_it() -> None:
    """spark-submit runs /opt/segtxn/check.py: manifests/spark/check.py, copied there."""
    shim = ROOT / "manifests" / "spark" / "check.py"
    dockerfile = (ROOT / "manifests" / "spark" / "Dockerfile").read_text()
    assert f"COPY manifests/spark/check.py {sparkapp.CHECK_SCRIPT}" in dockerfile
    done = subprocess.run(
        [sys.executable, str(shim), "verify", "check", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "--report-configmap" in done.stdout


def test_workload_and_check_are_commands_the_cli_accepts() -> None:
    _, pod = rendered(workload={"inputs": 50, "rate": 12.5, "processors": 2})
    [init] = pod["spec"]["initContainers"]
    assert init["command"] == ["segtxn"]
    params = cli(init["args"])
    assert (params["run"], params["inputs"], params["rate"], params["processors"]) == (
        "r1",
        50,
        12.5,
        2,
    )
    assert str(params["run_dir"]) == "/runs/r1" and params["url"] == URL
    [driver] = pod["spec"]["containers"]
    args = driver["args"]
    script = args.index(sparkapp.CHECK_SCRIPT)
    check = cli(args[script + 1 :])
    assert check["master"] == sparkapp.MASTER
    assert check["report_configmap"] == "r1-report"
    assert str(check["html_path"]) == "/runs/r1/report.html"


def test_the_report_owner_and_namespace_reach_the_driver() -> None:
    _, pod = rendered()
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    owner = yaml.safe_load(env[sparkapp.REPORT_OWNER_ENV]["value"])
    assert owner == {
        "apiVersion": "segtxn.io/v1alpha1",
        "kind": "VerificationRun",
        "name": "r1",
        "uid": UID,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    field = env[sparkapp.REPORT_NAMESPACE_ENV]["valueFrom"]["fieldRef"]["fieldPath"]
    assert field == "metadata.namespace"


def test_spec_settings_reach_spark() -> None:
    storage = {"size": "5Gi", "accessMode": "ReadWriteMany", "storageClassName": "nfs"}
    conf = sparkapp.spark_conf(
        "r1",
        "ns",
        spec(
            executors={"instances": 4, "cores": 2, "memory": "3g"},
            sparkConf={"spark.executor.memory": "4g", "spark.sql.shuffle.partitions": "8"},
            storage=storage,
        ),
    )
    assert conf["spark.executor.instances"] == "4" and conf["spark.executor.cores"] == "2"
    assert conf["spark.executor.memory"] == "4g"  # sparkConf has the last word
    assert conf["spark.sql.shuffle.partitions"] == "8"
    assert conf["spark.kubernetes.driver.pod.name"] == "r1-driver"  # executors' owner
    _, pod = rendered(storage=storage)
    [runs] = [v for v in pod["spec"]["volumes"] if v["name"] == "runs"]
    claim = runs["ephemeral"]["volumeClaimTemplate"]["spec"]
    assert claim == {
        "accessModes": ["ReadWriteMany"],
        "storageClassName": "nfs",
        "resources": {"requests": {"storage": "5Gi"}},
    }


@pytest.mark.parametrize("name", ["Upper", "has.dot", "x" * 41, "-lead", "trail-", ""])
def test_a_name_that_cannot_name_the_run_is_refused(name: str) -> None:
    with pytest.raises(InvalidRun, match="DNS label of at most 40"):
        render_run(name, "segtxn", UID, spec(), URL)


def test_the_chart_gives_the_driver_spark_rights_in_each_watched_namespace(helm: Helm) -> None:
    def spark(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
        return [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == "segtxn-spark"]

    docs = template(helm, "operator.watchNamespaces={team-a,team-b}")
    for kind in ("ServiceAccount", "Role", "RoleBinding"):
        assert sorted(d["metadata"]["namespace"] for d in spark(docs, kind)) == ["team-a", "team-b"]
    for doc in spark(docs, "Role"):
        validate(doc)
        [rule] = doc["rules"]
        assert set(rule["resources"]) == {
            "pods",
            "services",
            "configmaps",
            "persistentvolumeclaims",
        }
        assert {"create", "delete", "watch", "patch"} <= set(rule["verbs"])
    for binding in spark(docs, "RoleBinding"):
        [subject] = binding["subjects"]
        assert subject["namespace"] == binding["metadata"]["namespace"]
    wide = template(helm, "operator.clusterWide=true")
    assert [d["metadata"]["namespace"] for d in spark(wide, "Role")] == ["segtxn"]
    assert spark(template(helm, "spark.serviceAccount.create=false"), "Role") == []


def crd_schema() -> dict[str, Any]:
    return crd_schemas()[("segtxn.io/v1alpha1", "VerificationRun")]


def test_the_sample_run_fits_the_crd_and_renders() -> None:
    sample = yaml.safe_load((ROOT / "manifests" / "spark" / "verificationrun.yaml").read_text())
    validate(sample)
    stored = defaulted(sample, crd_schema())
    validate(stored)
    assert stored["spec"]["executors"]["instances"] == 2
    for obj in render_run(sample["metadata"]["name"], "segtxn", UID, stored["spec"], URL):
        validate(obj)


@pytest.mark.parametrize(
    ("spec_", "complaint"),
    [
        ({}, "'clusterRef' is a required property"),
        ({"clusterRef": "d", "executors": {"instances": 0}}, "less than the minimum"),
        ({"clusterRef": "d", "executors": {"memory": "1 GB"}}, "does not match"),
        ({"clusterRef": "d", "storage": {"accessMode": "ReadOnlyMany"}}, "is not one of"),
        ({"clusterRef": "d", "sparkConf": {"spark.executor.cores": 2}}, "is not of type"),
    ],
)
def test_bad_runs_are_refused_by_the_schema(spec_: dict[str, Any], complaint: str) -> None:
    doc = {
        "apiVersion": "segtxn.io/v1alpha1",
        "kind": "VerificationRun",
        "metadata": {"name": "x"},
        "spec": spec_,
    }
    with pytest.raises(jsonschema.ValidationError, match=complaint):
        validate(doc)


def test_the_crd_fixes_the_spec_and_the_name_rule_is_the_operators() -> None:
    """CEL is not run here (no API server): the rules are checked to be there, and the
    name pattern to be the one the operator refuses by itself (InvalidName)."""
    schema = crd_schema()
    spec_rules = [v["rule"] for v in schema["properties"]["spec"]["x-kubernetes-validations"]]
    assert spec_rules == ["self == oldSelf"]
    [name_rule] = [v["rule"] for v in schema["x-kubernetes-validations"]]
    pattern = re.search(r"matches\('\^(.*)\$'\)", name_rule)
    assert pattern is not None and pattern.group(1) == sparkapp.NAME.pattern
