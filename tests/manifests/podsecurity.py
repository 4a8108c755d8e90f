"""Kubernetes' Pod Security Standard "restricted" (v1.30), as a checker of pod templates.

No admission controller runs here, so the rules are written down once: the policies of
https://kubernetes.io/docs/concepts/security/pod-security-standards/ that a manifest can
break (baseline's and restricted's), each a message naming the container and the field.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

ALLOWED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}  # fmt: skip
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}  # fmt: skip
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def pod_spec(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod spec an object runs (a Pod, or a workload's template), None for others."""
    kind = obj.get("kind")
    if kind == "Pod":
        return dict(obj.get("spec", {}))
    if kind == "CronJob":
        return dict(obj["spec"]["jobTemplate"]["spec"]["template"]["spec"])
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        return dict(obj["spec"]["template"]["spec"])
    return None


def _containers(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for field in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(field) or ()


def violations(obj: Mapping[str, Any]) -> list[str]:
    """Every way ``obj``'s pods break "restricted" (empty when they pass, or for objects
    that run no pods)."""
    spec = pod_spec(obj)
    if spec is None:
        return []
    where = f"{obj['kind']}/{obj['metadata']['name']}"
    pod = spec.get("securityContext") or {}
    out = []
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            out.append(f"{where}: {field}")
    for volume in spec.get("volumes") or ():
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            out.append(f"{where}: volume {volume['name']} is {', '.join(sorted(kinds))}")
    for sysctl in pod.get("sysctls") or ():
        if sysctl.get("name") not in SAFE_SYSCTLS:
            out.append(f"{where}: sysctl {sysctl.get('name')}")
    if pod.get("runAsUser") == 0:
        out.append(f"{where}: pod runAsUser 0")
    for container in _containers(spec):
        at = f"{where} container {container['name']}"
        own = container.get("securityContext") or {}

        def effective(field: str, _own: Mapping[str, Any] = own) -> Any:
            return _own[field] if field in _own else pod.get(field)

        if effective("runAsNonRoot") is not True:
            out.append(f"{at}: runAsNonRoot is not true")
        if effective("runAsUser") == 0:
            out.append(f"{at}: runAsUser 0")
        seccomp = (effective("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{at}: seccompProfile.type is {seccomp!r}, not RuntimeDefault")
        if own.get("allowPrivilegeEscalation") is not False:
            out.append(f"{at}: allowPrivilegeEscalation is not false")
        if own.get("privileged"):
            out.append(f"{at}: privileged")
        capabilities = own.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or ()):
            out.append(f"{at}: capabilities.drop lacks ALL")
        if set(capabilities.get("add") or ()) - {"NET_BIND_SERVICE"}:
            out.append(f"{at}: capabilities.add {capabilities['add']}")
        if own.get("procMount", "Default") != "Default":
            out.append(f"{at}: procMount {own['procMount']}")
        selinux = (effective("seLinuxOptions") or {}).get("type", "")
        if selinux not in SELINUX_TYPES:
            out.append(f"{at}: seLinuxOptions.type {selinux}")
        apparmor = (effective("appArmorProfile") or {}).get("type")
        if apparmor == "Unconfined":
            out.append(f"{at}: appArmorProfile Unconfined")
        for port in container.get("ports") or ():
            if port.get("hostPort"):
                out.append(f"{at}: hostPort {port['hostPort']}")
    return out
