"""A VerificationRun rendered as a Spark-on-Kubernetes application, as pure functions.

One run is one pod the operator renders, ``<run>-driver``, and the executor pods Spark's
scheduler creates from it. The pod runs the workload (``segtxn verify run``, an init
container), then ``spark-submit --master k8s://… --deploy-mode client``: the driver is that
pod's main container, the executors are pods Spark creates in the run's namespace from the
executor pod template (the ConfigMap ``<run>-spark``) with the run's service account.

Why client mode in a pod the operator renders, rather than ``--deploy-mode cluster`` from
a submitter pod:

- **Ownership.** The driver pod is a child of the VerificationRun (an owner reference), and
  Spark makes every executor pod a child of the driver pod
  (``spark.kubernetes.driver.pod.name``): deleting the run garbage-collects all of it, and
  the operator needs no delete permission. In cluster mode spark-submit creates the driver
  pod itself, outside the operator's objects.
- **The run's files.** The workload writes ``run.json`` and the histories into the run's
  volume; the driver reads them where they were written, and the executors mount the same
  volume read-only (a generic ephemeral volume of the driver pod, ``<run>-driver-runs``):
  ``spark.read.json`` of the histories runs on the executors.
- **One object to watch.** The run's state is this pod's phase and the verdict ConfigMap
  the checker writes (:mod:`segtxn.verify.publish`); there is no submitter in between.

The volume is ReadWriteOnce by default, which Kubernetes lets every pod *on one node*
mount: the executors are scheduled beside the driver (kind, or any one node). A
ReadWriteMany storage class (``spec.storage.accessMode``) lets them spread.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from segtxn.operator.render import GROUP, VERSION, labels

Obj = dict[str, Any]

SPARK_UID = 185
"""The ``spark`` user of Apache's Spark image (manifests/spark/Dockerfile)."""
RUNS_DIR = "/runs"
TEMPLATES_DIR = "/etc/segtxn-spark"
EXECUTOR_TEMPLATE = "executor.yaml"
CHECK_SCRIPT = "/opt/segtxn/check.py"
"""spark-submit's primary resource in the image: ``segtxn`` with the arguments given."""
SPARK_SUBMIT = "/opt/spark/bin/spark-submit"
MASTER = "k8s://https://kubernetes.default.svc:443"
"""The API server as pods see it (the in-cluster Service)."""
DRIVER_PORT, BLOCK_MANAGER_PORT = 7078, 7079
RUN_LABEL = "segtxn.io/verification-run"
REPORT_OWNER_ENV = "SEGTXN_REPORT_OWNER"
REPORT_NAMESPACE_ENV = "SEGTXN_REPORT_NAMESPACE"
NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?")
"""A run's name: a DNS label of at most 40 characters. It names the run's topics, its pods
and Spark's executor pod prefix (a DNS label of at most 47), its label values (63)."""


class InvalidRun(ValueError):
    """A VerificationRun the operator cannot render (its name); the CRD's rules refuse
    the same on a real API server."""


@dataclass(frozen=True)
class RunNames:
    run: str

    @property
    def driver(self) -> str:
        return f"{self.run}-driver"

    @property
    def templates(self) -> str:
        """The ConfigMap holding the executor pod template."""
        return f"{self.run}-spark"

    @property
    def report(self) -> str:
        """The ConfigMap the checker writes: verdict, text summary, HTML report."""
        return f"{self.run}-report"

    @property
    def claim(self) -> str:
        """The driver pod's ephemeral volume's claim: ``<pod>-<volume>``, Kubernetes' rule."""
        return f"{self.driver}-runs"

    @property
    def run_dir(self) -> str:
        return f"{RUNS_DIR}/{self.run}"


def check_name(name: str) -> RunNames:
    """The run's names.

    Raises:
        InvalidRun: not a DNS label of at most 40 characters.
    """
    if not NAME.fullmatch(name):
        raise InvalidRun(
            f"VerificationRun name {name!r}: a DNS label of at most 40 characters (lower-case "
            "letters, digits, '-'): it names the run's topics, pods and executor pods"
        )
    return RunNames(name)


def _security() -> tuple[Obj, Obj]:
    """Pod Security "restricted", as the other pods segtxn renders; Spark writes scratch
    files beside itself, so the root filesystem stays writable (as in the verify Job)."""
    pod = {
        "runAsNonRoot": True,
        "runAsUser": SPARK_UID,
        "runAsGroup": SPARK_UID,
        "fsGroup": SPARK_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    container = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    return pod, container


def _labels(run: str, component: str) -> dict[str, str]:
    return {**labels(run, component), RUN_LABEL: run}


def executor_template(run: str, spec: Mapping[str, Any]) -> Obj:
    """The executor pod template (``spark.kubernetes.executor.podTemplateFile``): Spark sets
    the image, resources, env and ``args: [executor]`` on the container named ``executor``;
    the template adds what Spark does not: the image's Spark entry point (the verify
    image's own is ``segtxn``), Pod Security, the run's volume read-only, no API token."""
    names = RunNames(run)
    pod_security, container_security = _security()
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"labels": _labels(run, "verify-executor")},
        "spec": {
            "automountServiceAccountToken": False,
            "securityContext": pod_security,
            "containers": [
                {
                    "name": "executor",
                    "image": spec["image"],
                    "command": ["/opt/entrypoint.sh"],
                    "securityContext": container_security,
                    "volumeMounts": [{"name": "runs", "mountPath": RUNS_DIR, "readOnly": True}],
                }
            ],
            "volumes": [
                {
                    "name": "runs",
                    "persistentVolumeClaim": {"claimName": names.claim, "readOnly": True},
                }
            ],
        },
    }


def spark_conf(run: str, namespace: str, spec: Mapping[str, Any]) -> dict[str, str]:
    """The ``--conf`` pairs of the run's spark-submit (``$(POD_IP)`` is the kubelet's)."""
    executors = spec["executors"]
    conf = {
        "spark.kubernetes.namespace": namespace,
        "spark.kubernetes.container.image": spec["image"],
        "spark.kubernetes.container.image.pullPolicy": spec["imagePullPolicy"],
        "spark.kubernetes.driver.pod.name": RunNames(run).driver,
        "spark.kubernetes.executor.podNamePrefix": run,
        "spark.kubernetes.executor.podTemplateFile": f"{TEMPLATES_DIR}/{EXECUTOR_TEMPLATE}",
        "spark.kubernetes.executor.podTemplateContainerName": "executor",
        "spark.driver.host": "$(POD_IP)",
        "spark.driver.port": str(DRIVER_PORT),
        "spark.driver.blockManager.port": str(BLOCK_MANAGER_PORT),
        "spark.executor.instances": str(executors["instances"]),
        "spark.executor.cores": str(executors["cores"]),
        "spark.executor.memory": executors["memory"],
        "spark.ui.enabled": "false",
    }
    return {**conf, **{str(k): str(v) for k, v in spec.get("sparkConf", {}).items()}}


def check_args(run: str) -> list[str]:
    """``segtxn`` arguments of the check, run by the driver."""
    names = RunNames(run)
    return [
        "verify",
        "check",
        f"--run-dir={names.run_dir}",
        f"--master={MASTER}",
        f"--html={names.run_dir}/report.html",
        f"--report-configmap={names.report}",
    ]


def spark_submit_args(run: str, namespace: str, spec: Mapping[str, Any]) -> list[str]:
    """spark-submit's arguments (after ``spark-submit`` itself)."""
    conf = [a for k, v in spark_conf(run, namespace, spec).items() for a in ("--conf", f"{k}={v}")]
    return [
        "--master", MASTER, "--deploy-mode", "client", "--name", run,
        "--driver-memory", spec["driver"]["memory"],
        *conf,
        CHECK_SCRIPT, *check_args(run),
    ]  # fmt: skip


def owner_reference(run: str, uid: str) -> Obj:
    """The report ConfigMap's owner: the run (it goes when the run is deleted)."""
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VerificationRun", "name": run,
            "uid": uid, "controller": True, "blockOwnerDeletion": True}  # fmt: skip


def workload_args(run: str, broker_url: str, workload: Mapping[str, Any]) -> list[str]:
    names = RunNames(run)
    return [
        "verify",
        "run",
        f"--url={broker_url}",
        f"--run-dir={names.run_dir}",
        f"--run={run}",
        f"--inputs={workload['inputs']}",
        f"--rate={workload['rate']}",
        f"--processors={workload['processors']}",
    ]


def _driver_pod(run: str, namespace: str, uid: str, spec: Mapping[str, Any], url: str) -> Obj:
    """The driver pod. A container that fails leaves the tail of its log as its termination
    message (``FallbackToLogsOnError``): the operator's status says why the run failed."""
    names = RunNames(run)
    pod_security, container_security = _security()
    image = {"image": spec["image"], "imagePullPolicy": spec["imagePullPolicy"]}
    storage = spec["storage"]
    claim: Obj = {
        "accessModes": [storage["accessMode"]],
        "resources": {"requests": {"storage": storage["size"]}},
    }
    if storage.get("storageClassName"):
        claim["storageClassName"] = storage["storageClassName"]
    runs_mount = {"name": "runs", "mountPath": RUNS_DIR}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": names.driver,
            "namespace": namespace,
            "labels": _labels(run, "verify-driver"),
        },
        "spec": {
            "restartPolicy": "Never",
            "serviceAccountName": spec["serviceAccountName"],
            "securityContext": pod_security,
            "initContainers": [
                {
                    "name": "workload",
                    **image,
                    "command": ["segtxn"],
                    "args": workload_args(run, url, spec["workload"]),
                    "volumeMounts": [runs_mount],
                    "resources": spec["workload"]["resources"],
                    "securityContext": container_security,
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                }
            ],
            "containers": [
                {
                    "name": "driver",
                    **image,
                    "command": [SPARK_SUBMIT],
                    "args": spark_submit_args(run, namespace, spec),
                    "env": [
                        {
                            "name": "POD_IP",
                            "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                        },
                        {
                            "name": REPORT_NAMESPACE_ENV,
                            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
                        },
                        {
                            "name": REPORT_OWNER_ENV,
                            "value": json.dumps(owner_reference(run, uid), sort_keys=True),
                        },
                    ],
                    "ports": [
                        {"name": "driver", "containerPort": DRIVER_PORT},
                        {"name": "blockmanager", "containerPort": BLOCK_MANAGER_PORT},
                    ],
                    "volumeMounts": [
                        runs_mount,
                        {"name": "templates", "mountPath": TEMPLATES_DIR, "readOnly": True},
                    ],
                    "resources": spec["driver"]["resources"],
                    "securityContext": container_security,
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                }
            ],
            "volumes": [
                {
                    "name": "runs",
                    "ephemeral": {
                        "volumeClaimTemplate": {
                            "metadata": {"labels": _labels(run, "verify-runs")},
                            "spec": claim,
                        }
                    },
                },
                {"name": "templates", "configMap": {"name": names.templates}},
            ],
        },
    }


def render_run(
    run: str, namespace: str, uid: str, spec: Mapping[str, Any], broker_url: str
) -> list[Obj]:
    """The run's objects, in the order to apply them: the executor template's ConfigMap,
    then the driver pod that mounts it. ``uid`` is the run's (the report's owner).

    Raises:
        InvalidRun: the run's name cannot name its objects.
    """
    names = check_name(run)
    templates = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": names.templates,
            "namespace": namespace,
            "labels": _labels(run, "verify-templates"),
        },
        "data": {EXECUTOR_TEMPLATE: yaml.safe_dump(executor_template(run, spec), sort_keys=False)},
    }
    return [templates, _driver_pod(run, namespace, uid, spec, broker_url)]
