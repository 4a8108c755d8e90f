"""How a SegtxnCluster's servers reach its metadata store: TLS and an etcd user, from
Secrets named in ``spec.metadataStore`` (``tls``, ``auth``).

The brokers and the coordinators are the only parts of a cluster that talk to etcd (the
operator itself never does: it reaches the servers over HTTP). For an etcd that serves
TLS, requires client certificates or authenticates users, they need the ``--store-*``
flags (docs/security.md, "The metadata store connection") and the files those flags
name. This module renders both onto a workload the renderers of :mod:`.render` made:

- ``tls.secretName``: the Secret mounted at :data:`STORE_TLS_DIR`; ``--store-ca`` its
  ``ca.crt``, and ``--store-cert``/``--store-key`` its ``tls.crt``/``tls.key`` unless
  ``clientCertificate: false``. The chart's etcd writes such a Secret
  (``<fullname>-etcd-client-tls``, docs/kubernetes.md, "Names"); cert-manager's
  Certificates write the same keys.
- ``auth.secretName``: its ``password`` mounted at :data:`STORE_AUTH_DIR`
  (``--store-password-file``; a file, so it never shows in the pod's command line or
  environment) and its ``username`` given as ``--store-user`` through an environment
  variable.

Independent of ``spec.security`` (an etcd may want TLS from a cluster whose own listeners
do not serve it). Neither field set: nothing rendered, so clusters without them render
exactly as before. Whole directories are mounted, no ``subPath``: the kubelet then
updates renewed files in place, which the servers load again (docs/security.md).
Pure: no Kubernetes, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from segtxn.operator.secureservers import SECRET_MODE

Obj = dict[str, Any]

STORE_TLS_DIR = "/etc/segtxn/store-tls"
STORE_AUTH_DIR = "/etc/segtxn/store-auth"
USER_ENV = "SEGTXN_STORE_USER"


@dataclass(frozen=True)
class StoreAccess:
    """``spec.metadataStore``'s ``tls`` and ``auth``, with the CRD's defaults."""

    tls_secret: str | None = None
    """The Secret holding ``ca.crt`` (and ``tls.crt``, ``tls.key``); None: plain text."""
    client_certificate: bool = True
    """Present the Secret's ``tls.crt``/``tls.key`` to etcd."""
    auth_secret: str | None = None
    """The Secret holding ``username`` and ``password``; None: no etcd user."""

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> StoreAccess:
        """From a SegtxnCluster's spec (the CRD's schema has checked it)."""
        store = spec.get("metadataStore") or {}
        tls, auth = store.get("tls") or {}, store.get("auth") or {}
        return cls(
            tls_secret=str(tls["secretName"]) if tls.get("secretName") else None,
            client_certificate=bool(tls.get("clientCertificate", True)),
            auth_secret=str(auth["secretName"]) if auth.get("secretName") else None,
        )

    @property
    def enabled(self) -> bool:
        return self.tls_secret is not None or self.auth_secret is not None

    def flags(self) -> list[str]:
        """The servers' ``--store-*`` flags, reading the mounted files."""
        flags: list[str] = []
        if self.tls_secret is not None:
            flags.append(f"--store-ca={STORE_TLS_DIR}/ca.crt")
            if self.client_certificate:
                flags += [
                    f"--store-cert={STORE_TLS_DIR}/tls.crt",
                    f"--store-key={STORE_TLS_DIR}/tls.key",
                ]
        if self.auth_secret is not None:
            flags += [
                f"--store-user=$({USER_ENV})",
                f"--store-password-file={STORE_AUTH_DIR}/password",
            ]
        return flags

    def volumes(self) -> tuple[list[Obj], list[Obj]]:
        """(pod volumes, container mounts) for the Secrets' files."""
        volumes: list[Obj] = []
        mounts: list[Obj] = []
        if self.tls_secret is not None:
            keys = ["ca.crt", *(["tls.crt", "tls.key"] if self.client_certificate else [])]
            volumes.append(_secret_volume("store-tls", self.tls_secret, keys))
            mounts.append({"name": "store-tls", "mountPath": STORE_TLS_DIR, "readOnly": True})
        if self.auth_secret is not None:
            volumes.append(_secret_volume("store-auth", self.auth_secret, ["password"]))
            mounts.append({"name": "store-auth", "mountPath": STORE_AUTH_DIR, "readOnly": True})
        return volumes, mounts

    def env(self) -> list[Obj]:
        """The user name, from the auth Secret (``--store-user=$(SEGTXN_STORE_USER)``)."""
        if self.auth_secret is None:
            return []
        ref = {"name": self.auth_secret, "key": "username"}
        return [{"name": USER_ENV, "valueFrom": {"secretKeyRef": ref}}]


def _secret_volume(name: str, secret: str, keys: list[str]) -> Obj:
    """A Secret volume of ``keys`` only (a missing key keeps the pod from starting, with
    an event naming it, rather than starting a server that cannot reach its store)."""
    return {
        "name": name,
        "secret": {
            "secretName": secret,
            "defaultMode": SECRET_MODE,
            "items": [{"key": k, "path": k} for k in keys],
        },
    }


def secure_store(objects: list[Obj], cluster_spec: Mapping[str, Any]) -> list[Obj]:
    """The rendered ``objects`` (a cluster's or a TransactionCoordinator's) with their
    workload's only container given the store's flags, files and user (in place; returned
    for the caller's convenience). Nothing when ``cluster_spec`` names no store Secret."""
    access = StoreAccess.of(cluster_spec)
    if not access.enabled:
        return objects
    workload = next(o for o in objects if o["kind"] in ("StatefulSet", "Deployment"))
    pod = workload["spec"]["template"]["spec"]
    container = pod["containers"][0]
    volumes, mounts = access.volumes()
    pod["volumes"] = [*pod.get("volumes", []), *volumes]
    container["volumeMounts"] = [*container.get("volumeMounts", []), *mounts]
    container["env"] = [*container.get("env", []), *access.env()]
    container["args"] = [*container["args"], *access.flags()]
    return objects
