"""Desired state: custom resources rendered into Kubernetes objects, as pure functions.

Nothing here talks to Kubernetes or to segtxn; the handlers apply what these functions
return, in the order returned (``kopf.adopt`` adds the owner references). Names are
derived from the resource's name, so rendering the same spec twice yields the same
objects (applying is idempotent).

A ConfigMap is named after its content (:func:`config_map`) and comes first: a new
configuration is a new ConfigMap, and the pod template that names it is applied after
it. An apply that fails in between leaves the running workload on the ConfigMap it
already names, unchanged (a shared, rewritten ConfigMap would reach any pod that
restarted meanwhile: half the cluster on the new settings before the spec was applied).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from segtxn.operator import connections, replication, secureservers, security, storeaccess
from segtxn.operator.placement import placement, resources

Obj = dict[str, Any]

GROUP = "segtxn.io"
VERSION = "v1alpha1"
DATA_DIR = "/data"
UID = 10001
"""The image's unprivileged user (manifests/Dockerfile)."""
CONFIG_HASH = "segtxn.io/config-hash"
"""Pod-template annotation: a changed ConfigMap rolls the pods."""
CLUSTER_ANNOTATION = "segtxn.io/cluster"
"""A coordinators' Deployment's annotation: the SegtxnCluster they serve, as applied
(:func:`.immutable.coordinator_changes`: it cannot change). On the Deployment, not its pod
template: adding it rolls no pod."""
COORDINATOR_IDS = 4
"""``spec.coordinatorIds`` when absent (the CRD's default)."""


def labels(instance: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "segtxn",
        "app.kubernetes.io/instance": instance,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": "segtxn-operator",
    }


def selector(instance: str, component: str) -> dict[str, str]:
    return {k: v for k, v in labels(instance, component).items() if "managed-by" not in k}


# ---------------------------------------------------------------------- SegtxnCluster


@dataclass(frozen=True)
class ClusterNames:
    cluster: str

    @property
    def config(self) -> str:
        """The prefix of the names of the brokers' ConfigMaps (:func:`config_map`)."""
        return f"{self.cluster}-config"

    @property
    def brokers(self) -> str:
        """The StatefulSet, its PodDisruptionBudget and the client Service."""
        return f"{self.cluster}-broker"

    @property
    def headless(self) -> str:
        return f"{self.cluster}-broker-headless"


def service_url(cluster: str, namespace: str, spec: Mapping[str, Any]) -> str:
    """How clients inside Kubernetes reach the cluster's brokers."""
    port = spec.get("brokers", {}).get("port", 8080)
    return f"{security.scheme(spec)}://{ClusterNames(cluster).brokers}.{namespace}.svc:{port}"


def _hash(data: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(dict(data), sort_keys=True).encode()).hexdigest()[:16]


def _security() -> tuple[Obj, Obj]:
    """(pod securityContext, container securityContext): unprivileged, read-only root, the
    runtime's default seccomp profile, no capabilities: Pod Security "restricted" admits
    it (a namespace enforcing it refuses any pod without a seccomp profile)."""
    pod = {
        "runAsNonRoot": True,
        "runAsUser": UID,
        "runAsGroup": UID,
        "fsGroup": UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    container = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    return pod, container


def _probes(port: int, ready: str = "/readyz") -> Obj:
    def get(path: str, period: int, failures: int) -> Obj:
        return {
            "httpGet": {"path": path, "port": port},
            "periodSeconds": period,
            "failureThreshold": failures,
        }

    return {
        "startupProbe": get("/healthz", 2, 60),
        "livenessProbe": get("/healthz", 10, 3),
        "readinessProbe": get(ready, 5, 2),
    }


def _env(*pairs: tuple[str, Obj]) -> list[Obj]:
    return [{"name": name, **value} for name, value in pairs]


def _field(path: str) -> Obj:
    return {"valueFrom": {"fieldRef": {"fieldPath": path}}}


def _config(config_map: str, key: str) -> Obj:
    return {"valueFrom": {"configMapKeyRef": {"name": config_map, "key": key}}}


def config_map(
    prefix: str, namespace: str, labels: Mapping[str, str], data: Mapping[str, str]
) -> Obj:
    """An immutable ConfigMap holding ``data``, named ``<prefix>-<hash of data>``: the
    same data always has the same name, other data another name, and Kubernetes refuses
    any change to it (``immutable``; kubelets stop watching it too).

    Superseded ConfigMaps are not deleted (the operator has no delete permission, and a
    pod still rolling from the old template may need its ConfigMap to start): they go
    with their owner (owner references), one per configuration the resource has had."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"{prefix}-{_hash(data)}",
            "namespace": namespace,
            "labels": dict(labels),
        },
        "immutable": True,
        "data": dict(data),
    }


def config_ref(workload: Mapping[str, Any] | None) -> str | None:
    """The ConfigMap a live StatefulSet's or Deployment's pods read (the first container's
    first ``configMapKeyRef``), or None (no workload, or none read)."""
    template = (workload or {}).get("spec", {}).get("template", {})
    for container in template.get("spec", {}).get("containers", [])[:1]:
        for var in container.get("env") or ():
            ref = (var.get("valueFrom") or {}).get("configMapKeyRef")
            if ref:
                return str(ref["name"])
    return None


HEADER_WATCH = "headerWatch"
"""``spec.brokers.settings.headerWatch``: the brokers' ``--header-watch`` (prefix or scoped)."""
PUBLISH_BUFFER = "publishBufferBytes"
"""``spec.brokers.settings.publishBufferBytes``: the brokers' ``--publish-buffer-size``."""

COORDINATOR_CONFIG = ("storeUrl", "sessionTtlSeconds", replication.CONFIG_KEY, security.POLICY_KEY)
"""The keys of the cluster's configuration that coordinators read (their own ConfigMap
holds these): a change to any of them must roll the coordinators too, not only the
brokers. With replication on, coordinators keep their v4 transaction logs on the brokers'
storage nodes (``--replication``), so v4 transactions work without a shared volume."""


def cluster_config(spec: Mapping[str, Any]) -> dict[str, str]:
    """The cluster's ConfigMap data: what brokers (and, :data:`COORDINATOR_CONFIG`,
    coordinators) read from their environment at start."""
    settings = spec.get("brokers", {}).get("settings", {})
    return {
        "storeUrl": str(spec["metadataStore"]["url"]),
        "sessionTtlSeconds": str(settings.get("sessionTtlSeconds", 10)),
        "consumerHoldSeconds": str(settings.get("consumerHoldSeconds", 10)),
        "autoCreateTopics": str(bool(settings.get("autoCreateTopics", False))).lower(),
        "retentionTimeSeconds": str(settings.get("retentionTimeSeconds", 604800)),
        "retentionBytes": str(settings.get("retentionBytes", -1)),
        # Only when given: the ConfigMap (named after its content) of a cluster that does not
        # set it stays what it was, so an operator upgrade rolls no broker for it.
        **({HEADER_WATCH: str(settings[HEADER_WATCH])} if HEADER_WATCH in settings else {}),
        **(
            {PUBLISH_BUFFER: str(int(settings[PUBLISH_BUFFER]))}
            if PUBLISH_BUFFER in settings
            else {}
        ),
        **connections.config_data(settings),
        **replication.config_data(spec),
        **security.config_data(spec),
    }


def broker_storage(spec: Mapping[str, Any]) -> tuple[str, str]:
    """(size, storage class; "" for the cluster's default) of each broker's volume claim.
    Fixed once the StatefulSet exists: Kubernetes refuses changes to its claim templates."""
    storage = spec.get("brokers", {}).get("storage", {})
    return str(storage.get("size", "10Gi")), str(storage.get("storageClassName") or "")


def render_cluster(name: str, namespace: str, spec: Mapping[str, Any]) -> list[Obj]:
    """ConfigMap (first: :func:`config_map`), headless + client Services, broker
    StatefulSet (one PVC per broker; ``--replication`` when ``spec.brokers.replication``
    is set, :mod:`.replication`; placement and resources from ``spec.brokers``,
    :mod:`.placement`; ``OnDelete``: the operator rolls it, :mod:`.rolling`),
    PodDisruptionBudget (:func:`.replication.max_unavailable`: one broker down at a time).
    The store's TLS and user (:mod:`.storeaccess`) and the cluster's security
    (:mod:`.security`) are added to the rendered objects last."""
    names = ClusterNames(name)
    brokers = spec.get("brokers", {})
    port = int(brokers.get("port", 8080))
    replicas = int(brokers.get("replicas", 3))
    config = cluster_config(spec)
    component = labels(name, "broker")
    config_obj = config_map(names.config, namespace, component, config)
    config_name = config_obj["metadata"]["name"]
    select = selector(name, "broker")
    pod_security, container_security = _security()
    args = [
        "broker",
        "--store=$(SEGTXN_STORE)",
        f"--data-dir={DATA_DIR}",
        f"--advertise=http://$(POD_NAME).{names.headless}.$(POD_NAMESPACE).svc:{port}",
        "--broker-id=$(POD_NAME)",
        f"--port={port}",
        "--session-ttl=$(SEGTXN_SESSION_TTL)",
        "--consumer-hold=$(SEGTXN_CONSUMER_HOLD)",
        "--retention-time=$(SEGTXN_RETENTION_TIME)",
        "--retention-size=$(SEGTXN_RETENTION_SIZE)",
    ]
    if config["autoCreateTopics"] == "true":
        args.append("--auto-create-topics")
    if HEADER_WATCH in config:
        args.append("--header-watch=$(SEGTXN_HEADER_WATCH)")
    if PUBLISH_BUFFER in config:
        args.append("--publish-buffer-size=$(SEGTXN_PUBLISH_BUFFER)")
    env = _env(
        ("POD_NAME", _field("metadata.name")),
        ("POD_NAMESPACE", _field("metadata.namespace")),
        ("SEGTXN_STORE", _config(config_name, "storeUrl")),
        ("SEGTXN_SESSION_TTL", _config(config_name, "sessionTtlSeconds")),
        ("SEGTXN_CONSUMER_HOLD", _config(config_name, "consumerHoldSeconds")),
        ("SEGTXN_RETENTION_TIME", _config(config_name, "retentionTimeSeconds")),
        ("SEGTXN_RETENTION_SIZE", _config(config_name, "retentionBytes")),
    )
    if HEADER_WATCH in config:
        env += _env(("SEGTXN_HEADER_WATCH", _config(config_name, HEADER_WATCH)))
    if PUBLISH_BUFFER in config:
        env += _env(("SEGTXN_PUBLISH_BUFFER", _config(config_name, PUBLISH_BUFFER)))
    for arg, var, key in connections.broker_flags(config):  # (only those the spec sets)
        args.append(arg)
        env += _env((var, _config(config_name, key)))
    if replication.CONFIG_KEY in config:
        args.append("--replication=$(SEGTXN_REPLICATION)")
        env += _env(("SEGTXN_REPLICATION", _config(config_name, replication.CONFIG_KEY)))
        if replication.REPAIR_KEY in config:
            args.append("--repair-interval=$(SEGTXN_REPAIR_INTERVAL)")
            env += _env(("SEGTXN_REPAIR_INTERVAL", _config(config_name, replication.REPAIR_KEY)))
    size, storage_class = broker_storage(spec)
    claim: Obj = {
        "metadata": {"name": "data", "labels": component},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": size}},
        },
    }
    if storage_class:
        claim["spec"]["storageClassName"] = storage_class
    container: Obj = {
        "name": "broker",
        "image": spec.get("image", "segtxn:0.1.0"),
        "imagePullPolicy": spec.get("imagePullPolicy", "IfNotPresent"),
        "command": ["segtxn"],
        "args": args,
        "env": env,
        "ports": [{"name": "http", "containerPort": port}],
        "volumeMounts": [{"name": "data", "mountPath": DATA_DIR}],
        "resources": resources(brokers),
        "securityContext": container_security,
        **_probes(port),
    }
    objects = [
        config_obj,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": names.headless, "namespace": namespace, "labels": component},
            "spec": {
                "clusterIP": "None",
                # Brokers find each other (and clients follow redirects) before readiness.
                "publishNotReadyAddresses": True,
                "selector": select,
                "ports": [{"name": "http", "port": port, "targetPort": "http"}],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": names.brokers, "namespace": namespace, "labels": component},
            "spec": {
                "selector": select,
                "ports": [{"name": "http", "port": port, "targetPort": "http"}],
            },
        },
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": names.brokers, "namespace": namespace, "labels": component},
            "spec": {
                "serviceName": names.headless,
                "replicas": replicas,
                "podManagementPolicy": "Parallel",
                # The operator replaces the pods, one at a time, draining each first
                # (:mod:`.rolling`); the controller only makes new pods from the template.
                "updateStrategy": {"type": "OnDelete"},
                "selector": {"matchLabels": select},
                "template": {
                    "metadata": {
                        "labels": component,
                        "annotations": {CONFIG_HASH: _hash(config)},
                    },
                    "spec": {
                        "securityContext": pod_security,
                        "terminationGracePeriodSeconds": 30,
                        "containers": [container],
                        **placement(brokers, select),
                    },
                },
                "volumeClaimTemplates": [claim],
            },
        },
        _pdb(names.brokers, namespace, component, select, replication.broker_budget(spec)),
    ]
    return secureservers.secure_cluster(storeaccess.secure_store(objects, spec), name, spec)


def _pdb(name: str, namespace: str, component: Obj, select: Obj, max_unavailable: int = 1) -> Obj:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace, "labels": component},
        "spec": {"maxUnavailable": max_unavailable, "selector": {"matchLabels": select}},
    }


# ---------------------------------------------------------------------- TransactionCoordinator


def coordinator_name(name: str) -> str:
    """The coordinators' Deployment, Service and PodDisruptionBudget."""
    return f"{name}-coordinator"


def coordinator_url(
    name: str, namespace: str, spec: Mapping[str, Any], cluster_spec: Mapping[str, Any]
) -> str:
    """How the operator reaches a TransactionCoordinator's coordinators (its Service;
    ``https`` when its cluster's security is on)."""
    port = spec.get("port", 8081)
    return f"{security.scheme(cluster_spec)}://{coordinator_name(name)}.{namespace}.svc:{port}"


def render_coordinator(
    name: str, namespace: str, spec: Mapping[str, Any], cluster_spec: Mapping[str, Any]
) -> list[Obj]:
    """ConfigMap (first: :func:`config_map`), Deployment, Service and
    PodDisruptionBudget (one coordinator down at a time) of the coordinators of
    ``spec``, their placement and resources from ``spec`` (:mod:`.placement`); the
    store, session TTL and image come from the SegtxnCluster they serve
    (``cluster_spec``), so a change there must re-render these too (the cluster's
    handler does).

    The coordinators' ConfigMap is their own (owned by the TransactionCoordinator), with
    only the cluster settings they read (:data:`COORDINATOR_CONFIG`): a broker-only
    setting changes neither its name nor their pod template, so it does not roll them,
    and it exists before the Deployment that names it whatever the cluster's handler has
    applied yet. The pod template also carries a hash of that data (env from a ConfigMap
    is read only when a pod starts). The Deployment rolls one pod at a time and starts
    the new one before the old goes (``maxUnavailable: 0``): the running coordinators
    keep serving their ids meanwhile.
    """
    full = coordinator_name(name)
    port = int(spec.get("port", 8081))
    component = labels(name, "coordinator")
    select = selector(name, "coordinator")
    read = {k: v for k, v in cluster_config(cluster_spec).items() if k in COORDINATOR_CONFIG}
    config_obj = config_map(f"{full}-config", namespace, component, read)
    config = config_obj["metadata"]["name"]
    replicated = replication.CONFIG_KEY in read
    pod_security, container_security = _security()
    flags = {
        "ids": spec.get("coordinatorIds", COORDINATOR_IDS),
        "default-timeout": spec.get("defaultTimeoutSeconds", 60),
        "timeout-sweep": spec.get("timeoutSweepSeconds", 1),
        "gc-sweep": spec.get("gcSweepSeconds", 10),
        "gc-retention": spec.get("gcRetentionSeconds", 60),
    }
    container: Obj = {
        "name": "coordinator",
        "image": cluster_spec.get("image", "segtxn:0.1.0"),
        "imagePullPolicy": cluster_spec.get("imagePullPolicy", "IfNotPresent"),
        "command": ["segtxn"],
        "args": [
            "coordinator",
            "--store=$(SEGTXN_STORE)",
            f"--advertise=http://$(POD_IP):{port}",
            f"--port={port}",
            "--session-ttl=$(SEGTXN_SESSION_TTL)",
            *(f"--{flag}={value}" for flag, value in flags.items()),
            *(["--replication=$(SEGTXN_REPLICATION)"] if replicated else []),
            *connections.coordinator_args(spec),
        ],
        "env": _env(
            ("POD_IP", _field("status.podIP")),
            ("SEGTXN_STORE", _config(config, "storeUrl")),
            ("SEGTXN_SESSION_TTL", _config(config, "sessionTtlSeconds")),
            *(
                [("SEGTXN_REPLICATION", _config(config, replication.CONFIG_KEY))]
                if replicated
                else []
            ),
        ),
        "ports": [{"name": "http", "containerPort": port}],
        "resources": resources(spec),
        "securityContext": container_security,
        # Ready once registered and campaigning for every id (its /healthz answers only
        # after that): a standby holding no id yet is what keeps every id served while
        # another goes. /readyz (holds an id) would keep a standby unready for ever, and
        # a rollout with maxUnavailable 0, or a node drain under the budget, stuck.
        **_probes(port, ready="/healthz"),
    }
    objects = [
        config_obj,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": full,
                "namespace": namespace,
                "labels": component,
                "annotations": {CLUSTER_ANNOTATION: str(spec.get("clusterRef", ""))},
            },
            "spec": {
                "replicas": int(spec.get("replicas", 2)),
                "strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
                },
                "selector": {"matchLabels": select},
                "template": {
                    "metadata": {
                        "labels": component,
                        "annotations": {CONFIG_HASH: _hash(read)},
                    },
                    "spec": {
                        "securityContext": pod_security,
                        "terminationGracePeriodSeconds": 30,
                        "containers": [container],
                        **placement(spec, select),
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": full, "namespace": namespace, "labels": component},
            "spec": {
                "selector": select,
                "ports": [{"name": "http", "port": port, "targetPort": "http"}],
            },
        },
        _pdb(full, namespace, component, select),
    ]
    cluster = str(spec.get("clusterRef", ""))
    storeaccess.secure_store(objects, cluster_spec)
    return secureservers.secure_coordinator(objects, name, namespace, cluster, cluster_spec)
