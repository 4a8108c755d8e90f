"""What a secured cluster's brokers and coordinators run with: HTTPS with the
cluster's certificates, tokens checked, the policy read from a file.

With ``spec.security.enabled`` (:mod:`.security`) the renderers of :mod:`.render` pass
their objects through :func:`secure_cluster` and :func:`secure_coordinator`, which turn
the rendered workload's container to HTTPS in place: flags naming the mounted files, the
Secrets and the policy mounted (whole directories, so that a renewed certificate reaches
the pod and the server reloads it), probes over HTTPS. Done on the rendered objects so
that clusters without security render exactly as before (an operator upgrade must not
roll them). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from segtxn.operator.security import POLICY_KEY, Obj, SecuritySpec
from segtxn.operator.securitynames import (
    auth_secret,
    broker_tls_secret,
    coordinator_tls_secret,
    pod_dns_domain,
)

TLS_DIR = "/etc/segtxn/tls"
AUTH_DIR = "/etc/segtxn/auth"
POLICY_DIR = "/etc/segtxn/policy"
SECRET_MODE = 0o440
"""Secret files: readable by the pods' group (their ``fsGroup``), nobody else."""


def server_flags(sec: SecuritySpec) -> list[str]:
    """The servers' ``--tls-*`` and ``--auth-*`` flags, reading the mounted files."""
    flags = [
        f"--tls-cert={TLS_DIR}/tls.crt",
        f"--tls-key={TLS_DIR}/tls.key",
        f"--tls-ca={TLS_DIR}/ca.crt",
        f"--auth-public-key={AUTH_DIR}/public.pem",
        f"--auth-cluster-token={AUTH_DIR}/cluster.jwt",
        f"--auth-policy={POLICY_DIR}/{POLICY_KEY}",
    ]
    if sec.client_certificates:
        # Probes present no certificate and still pass: segtxn/auth/clientcerts.py.
        flags.append(f"--tls-client-ca={TLS_DIR}/ca.crt")
    return [*flags, "--auth-protect-metrics"] if sec.protect_metrics else flags


def _volumes(tls_secret: str, cluster: str, config_map: str) -> tuple[list[Obj], list[Obj]]:
    """(pod volumes, container mounts). Whole directories, no ``subPath``: the kubelet
    then updates a renewed certificate in place and the servers reload it."""
    volumes = [
        {"name": "tls", "secret": {"secretName": tls_secret, "defaultMode": SECRET_MODE}},
        {
            "name": "auth",
            "secret": {"secretName": auth_secret(cluster), "defaultMode": SECRET_MODE},
        },
        {
            "name": "policy",
            "configMap": {"name": config_map, "items": [{"key": POLICY_KEY, "path": POLICY_KEY}]},
        },
    ]
    mounts = [
        {"name": "tls", "mountPath": TLS_DIR, "readOnly": True},
        {"name": "auth", "mountPath": AUTH_DIR, "readOnly": True},
        {"name": "policy", "mountPath": POLICY_DIR, "readOnly": True},
    ]
    return volumes, mounts


def _secure_workload(
    workload: Obj, tls_secret: str, cluster: str, sec: SecuritySpec, advertise: str | None
) -> None:
    """Turn a rendered workload's (only) container to HTTPS and tokens, in place: its
    ``--advertise`` to ``https://`` (the servers refuse an ``http://`` one with a
    certificate), the flags and mounts added, the probes over HTTPS (the kubelet does not
    verify the certificate). Done on the rendered object so that :mod:`.render` stays as it
    was for clusters without security, which must render exactly as before."""
    pod = workload["spec"]["template"]["spec"]
    container = pod["containers"][0]
    config = next(
        v["valueFrom"]["configMapKeyRef"]["name"]
        for v in container["env"]
        if "configMapKeyRef" in v.get("valueFrom", {})
    )
    args = [a.replace("--advertise=http://", "--advertise=https://", 1) for a in container["args"]]
    container["args"] = [*args, *([advertise] if advertise else []), *server_flags(sec)]
    volumes, mounts = _volumes(tls_secret, cluster, config)
    pod["volumes"] = [*pod.get("volumes", []), *volumes]
    container["volumeMounts"] = [*container.get("volumeMounts", []), *mounts]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        if probe in container:
            container[probe]["httpGet"]["scheme"] = "HTTPS"


def _workload(objects: Iterable[Obj]) -> Obj:
    return next(o for o in objects if o["kind"] in ("StatefulSet", "Deployment"))


def secure_cluster(objects: list[Obj], name: str, spec: Mapping[str, Any]) -> list[Obj]:
    """The cluster's rendered ``objects`` with the brokers on HTTPS and tokens when
    security is on (in place; returned for the caller's convenience)."""
    sec = SecuritySpec.of(spec)
    if sec.enabled:
        _secure_workload(_workload(objects), broker_tls_secret(name), name, sec, None)
    return objects


def secure_coordinator(
    objects: list[Obj], name: str, namespace: str, cluster: str, cluster_spec: Mapping[str, Any]
) -> list[Obj]:
    """A TransactionCoordinator's rendered ``objects`` with its coordinators on HTTPS and
    tokens when its cluster's security is on. They advertise their pod DNS name
    (``--pod-dns``), which their certificate covers; their IP would need a certificate
    per pod."""
    sec = SecuritySpec.of(cluster_spec)
    if sec.enabled:
        pod_dns = f"--pod-dns={pod_dns_domain(namespace)}"
        _secure_workload(_workload(objects), coordinator_tls_secret(name), cluster, sec, pod_dns)
    return objects
