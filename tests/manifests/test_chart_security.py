"""The chart's cluster.security with a real helm: on by default in the created cluster,
off when asked, the roles and cert-manager settings reaching spec.security as the operator
reads them, and what the operator renders from each valid for Kubernetes 1.30."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from segtxn.operator import certmanager, render, security
from segtxn.operator.security import CertificateSource, SecuritySpec
from tests.manifests.support import (
    CHART,
    KUBE_VERSION,
    Doc,
    crd_schemas,
    operator_roles,
    template,
    validate,
)
from tests.manifests.test_crds import defaulted

Helm = Callable[..., str]
API = "segtxn.io/v1alpha1"


def created(helm: Helm, *sets: str) -> tuple[list[Doc], dict[str, Any]]:
    """Every document of ``helm template`` (each validated) and the created cluster's spec
    as the API server would store it."""
    docs = template(helm, "cluster.create=true", *sets)
    for doc in docs:
        validate(doc)
    [found] = [d for d in docs if d["kind"] == "SegtxnCluster"]
    return docs, dict(defaulted(found, crd_schemas()[(API, "SegtxnCluster")])["spec"])


def rendered(spec: dict[str, Any]) -> list[render.Obj]:
    """What the operator applies for the chart's cluster and coordinators, validated."""
    coordinator = dict(
        defaulted(
            {"apiVersion": API, "kind": "TransactionCoordinator", "metadata": {"name": "segtxn"},
             "spec": {"clusterRef": "segtxn"}},
            crd_schemas()[(API, "TransactionCoordinator")],
        )["spec"]
    )  # fmt: skip
    objects = [
        *render.render_cluster("segtxn", "segtxn", spec),
        *render.render_coordinator("segtxn", "segtxn", coordinator, spec),
    ]
    for obj in objects:
        validate(obj)
    return objects


def pod(objects: list[render.Obj], kind: str) -> dict[str, Any]:
    return dict(next(o for o in objects if o["kind"] == kind)["spec"]["template"]["spec"])


def test_security_is_on_by_default_in_the_created_cluster(helm: Helm) -> None:
    _, spec = created(helm)
    sec = SecuritySpec.of(spec)
    assert sec.enabled and sec.certificates is CertificateSource.OPERATOR
    assert sec.policy().principal(security.CLUSTER_ROLE).superuser
    objects = rendered(spec)
    for kind in ("StatefulSet", "Deployment"):
        spec_of = pod(objects, kind)
        assert {v["name"] for v in spec_of["volumes"]} == {"tls", "auth", "policy", "store-tls"}
        assert "--auth-policy=/etc/segtxn/policy/policy.yaml" in spec_of["containers"][0]["args"]
    assert render.service_url("segtxn", "segtxn", spec).startswith("https://")


def test_switched_off_the_cluster_and_its_pods_have_none_of_it(helm: Helm) -> None:
    _, spec = created(helm, "cluster.security.enabled=false", "etcd.tls.enabled=false")
    assert spec["security"] == {"enabled": False, **_crd_defaults()}
    objects = rendered(spec)
    for kind in ("StatefulSet", "Deployment"):
        spec_of = pod(objects, kind)
        assert "volumes" not in spec_of
        assert not [
            a
            for a in spec_of["containers"][0]["args"]
            if a.startswith(("--tls", "--auth", "--store-"))
        ]
    assert render.service_url("segtxn", "segtxn", spec).startswith("http://")


def test_client_certificates_reach_the_servers_flags(helm: Helm) -> None:
    _, spec = created(helm, "cluster.security.clientCertificates=true")
    assert SecuritySpec.of(spec).client_certificates
    for kind in ("StatefulSet", "Deployment"):
        args = pod(rendered(spec), kind)["containers"][0]["args"]
        assert "--tls-client-ca=/etc/segtxn/tls/ca.crt" in args
    _, default = created(helm)
    assert "--tls-client-ca" not in str(pod(rendered(default), "StatefulSet"))


def _crd_defaults() -> dict[str, Any]:
    return {"certificates": "operator", "certificateDays": 365, "renewBeforeDays": 30,
            "tokenDays": 365, "protectMetrics": False, "clientCertificates": False}  # fmt: skip


def test_roles_and_cert_manager_reach_the_cluster(helm: Helm) -> None:
    docs, spec = created(
        helm,
        "cluster.security.certificates=cert-manager",
        "cluster.security.certManagerIssuer.name=corp-ca",
        "cluster.security.certManagerIssuer.kind=ClusterIssuer",
        "cluster.security.superusers={ops}",
        "cluster.security.roles.orders-app[0].resource=acme/orders",
        "cluster.security.roles.orders-app[0].actions={produce,consume}",
        "cluster.security.protectMetrics=true",
    )
    sec = SecuritySpec.of(spec)
    assert sec.certificates is CertificateSource.CERT_MANAGER
    assert sec.issuer == {"name": "corp-ca", "kind": "ClusterIssuer"}
    assert sec.token_roles() == ["ops", "orders-app", security.ADMIN_ROLE]
    policy = sec.policy()
    assert policy.principal("ops").superuser
    assert policy.roles["orders-app"][0].resource == "acme/orders"
    objects = certmanager.cert_manager_objects("segtxn", "segtxn", spec, {})
    assert [o["kind"] for o in objects] == ["Certificate"]  # the given issuer: no bootstrap
    issuer = {"group": "cert-manager.io", "kind": "ClusterIssuer", "name": "corp-ca"}
    assert objects[0]["spec"]["issuerRef"] == issuer
    assert "--auth-protect-metrics" in pod(rendered(spec), "StatefulSet")["containers"][0]["args"]
    # The operator may write what it needs for it: Secrets and cert-manager's objects.
    [role] = operator_roles(docs)  # (the chart also has the Spark driver's Role)
    assert {"apiGroups": ["cert-manager.io"], "resources": ["certificates", "issuers"],
            "verbs": ["create", "patch"]} in role["rules"]  # fmt: skip


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("cluster.security.roles.Bad_Role[0].resource=a/b", "Bad_Role"),
        ("cluster.security.certificates=vault", "cluster.security.certificates must be one of"),
        ("cluster.security.roles.app[0].resource=a/b/c", "roles.app.0.resource: Does not match"),
    ],
)
def test_what_the_servers_cannot_run_fails_at_install(helm: Helm, value: str, says: str) -> None:
    out = helm("template", "rel", str(CHART), "--kube-version", KUBE_VERSION,
               "--set", "cluster.create=true", "--set", value, ok=False)  # fmt: skip
    assert says in out, out
