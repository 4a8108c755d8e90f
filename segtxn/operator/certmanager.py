"""cert-manager's objects for a secured cluster (``certificates: cert-manager``).

Instead of the operator's own CA (:mod:`.credentials`), cert-manager issues the servers'
certificates into the same Secrets (``tls.crt``, ``tls.key``, ``ca.crt``; names in
:mod:`.securitynames`) and renews them: the operator renders the Issuers and Certificates
and applies them. Without an ``issuerRef`` it bootstraps a CA of the cluster's own with a
self-signed Issuer (cert-manager's own CA recipe). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from segtxn.operator.security import CertificateSource, Obj, SecuritySpec
from segtxn.operator.securitynames import (
    broker_dns_names,
    broker_tls_secret,
    ca_secret,
    coordinator_dns_names,
    coordinator_tls_secret,
)

CERT_MANAGER = "cert-manager.io/v1"


def _issuer(name: str, namespace: str, labels: Mapping[str, str], body: Obj) -> Obj:
    return {
        "apiVersion": CERT_MANAGER,
        "kind": "Issuer",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": body,
    }


def _certificate(name: str, namespace: str, labels: Mapping[str, str], spec: Obj) -> Obj:
    return {
        "apiVersion": CERT_MANAGER,
        "kind": "Certificate",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": spec,
    }


def issuer_ref(cluster: str, sec: SecuritySpec) -> Obj:
    """What signs the servers' certificates: the spec's issuer, else the cluster's CA
    issuer (:func:`cert_manager_objects`)."""
    if sec.issuer:
        return {"group": "cert-manager.io", "kind": "Issuer", **sec.issuer}
    return {"group": "cert-manager.io", "kind": "Issuer", "name": ca_secret(cluster)}


def server_certificate(
    secret: str,
    namespace: str,
    labels: Mapping[str, str],
    *,
    dns_names: list[str],
    issuer: Obj,
    sec: SecuritySpec,
) -> Obj:
    """A cert-manager Certificate for a server Secret (renewed by cert-manager
    ``renewBeforeDays`` before it ends, the kubelet then updates the pods' files)."""
    return _certificate(
        secret,
        namespace,
        labels,
        {
            "secretName": secret,
            "commonName": dns_names[0],
            "dnsNames": dns_names,
            "duration": f"{sec.certificate_days * 24}h",
            "renewBefore": f"{sec.renew_before_days * 24}h",
            "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
            "usages": ["server auth", "client auth", "digital signature"],
            "issuerRef": issuer,
        },
    )


def cert_manager_objects(
    name: str, namespace: str, spec: Mapping[str, Any], labels: Mapping[str, str]
) -> list[Obj]:
    """cert-manager's objects for the cluster (``certificates: cert-manager``; none
    otherwise): without an ``issuerRef``, a self-signed Issuer that bootstraps a CA
    Certificate (Secret :func:`ca_secret`) and a CA Issuer of it (cert-manager's own CA
    recipe); then the brokers' Certificate (Secret :func:`broker_tls_secret`)."""
    sec = SecuritySpec.of(spec)
    if not sec.enabled or sec.certificates is not CertificateSource.CERT_MANAGER:
        return []
    objects: list[Obj] = []
    if not sec.issuer:
        bootstrap = f"{name}-selfsigned"
        objects += [
            _issuer(bootstrap, namespace, labels, {"selfSigned": {}}),
            _certificate(
                ca_secret(name),
                namespace,
                labels,
                {
                    "isCA": True,
                    "commonName": f"{name} segtxn cluster CA",
                    "secretName": ca_secret(name),
                    "duration": "87600h",
                    "privateKey": {"algorithm": "ECDSA", "size": 256},
                    "issuerRef": {"group": "cert-manager.io", "kind": "Issuer", "name": bootstrap},
                },
            ),
            _issuer(ca_secret(name), namespace, labels, {"ca": {"secretName": ca_secret(name)}}),
        ]
    objects.append(
        server_certificate(
            broker_tls_secret(name),
            namespace,
            labels,
            dns_names=broker_dns_names(name, namespace),
            issuer=issuer_ref(name, sec),
            sec=sec,
        )
    )
    return objects


def coordinator_certificate(
    coordinator: str,
    namespace: str,
    cluster: str,
    cluster_spec: Mapping[str, Any],
    labels: Mapping[str, str],
) -> list[Obj]:
    """A TransactionCoordinator's cert-manager Certificate (none unless its cluster uses
    cert-manager)."""
    sec = SecuritySpec.of(cluster_spec)
    if not sec.enabled or sec.certificates is not CertificateSource.CERT_MANAGER:
        return []
    return [
        server_certificate(
            coordinator_tls_secret(coordinator),
            namespace,
            labels,
            dns_names=coordinator_dns_names(coordinator, namespace),
            issuer=issuer_ref(cluster, sec),
            sec=sec,
        )
    ]
