"""A SegtxnCluster's security switch (``spec.security``): what it means, what it renders.

With ``spec.security.enabled`` every broker and coordinator of the cluster serves HTTPS
only, with a certificate of the cluster's own CA, and checks a signed token on every call
(docs/security.md). The operator provides what that takes:

- **Certificates**: by default its own (:mod:`.credentials` keeps a CA per cluster in a
  Secret and issues the servers' certificates from it, renewing them before they expire);
  with ``certificates: cert-manager`` it renders cert-manager ``Issuer``/``Certificate``
  objects instead (:func:`cert_manager_objects`) and cert-manager writes the same Secrets.
  The Secrets hold ``tls.crt``, ``tls.key`` and ``ca.crt`` either way.
- **Tokens**: an ES256 signing key the operator alone holds; the servers get its public
  half and a token of the *cluster role* (:data:`CLUSTER_ROLE`, a superuser: servers call
  each other with it); the *admin role* (:data:`ADMIN_ROLE`, ``admin`` on ``*``) has a
  token in a Secret for people and for the operator's own calls; every role of
  ``spec.security.roles`` and ``superusers`` gets one too; with ``clientCertificates``
  (mutual TLS, operator certificates only) each token Secret also holds a client
  certificate naming its role, and the servers get ``--tls-client-ca``.
- **Roles**: the policy is part of the cluster's spec (``superusers`` and ``roles``, the
  servers' policy file format, checked by the CRD schema). Rendered into the cluster's
  content-named ConfigMap (key :data:`POLICY_KEY`), so a changed policy rolls the brokers
  and then the coordinators like any setting (servers read it at start-up).

Off (the default, and absent): nothing of it is rendered, so clusters without it are not
rolled by an operator that knows about it. This module is pure: the renderers of
:mod:`.render` pass their objects through :func:`secure_cluster` and
:func:`secure_coordinator`.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from segtxn.auth.policy import Policy
from segtxn.auth.tokens import AuthConfigError

Obj = dict[str, Any]

FIELD = "spec.security"
CLUSTER_ROLE = "segtxn-cluster"
"""The role servers present to each other (``--auth-cluster-token``): a superuser."""
ADMIN_ROLE = "segtxn-admin"
"""The role of the admin token (``admin`` on ``*``): the operator's own calls, and people."""
RESERVED = (CLUSTER_ROLE, ADMIN_ROLE)
ROLE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
"""A role name: a DNS label (it names the Secret ``<cluster>-token-<role>``)."""
MAX_ROLE_NAME = 40
"""The longest role name: the CRD's ``maxLength`` of a superuser, and its rule on
``roles``' keys."""
MAX_ROLES = 64
"""The most entries ``spec.security.roles`` may hold (the CRD's ``maxProperties``). Each
role costs a token Secret (and, with ``clientCertificates``, a certificate) that every
renewal pass reads and may re-issue, and a policy entry in the ConfigMap every server
mounts; the bound also keeps the CRD's rule over the roles cheap for the API server to
admit (a CEL rule's estimated cost grows with the size of the map it walks)."""
POLICY_KEY = "policy.yaml"
"""The cluster ConfigMap's key holding the rendered policy (JSON, which is YAML)."""
TLS_DIR = "/etc/segtxn/tls"
AUTH_DIR = "/etc/segtxn/auth"
POLICY_DIR = "/etc/segtxn/policy"
SECRET_MODE = 0o440
"""Secret files: readable by the pods' group (their ``fsGroup``), nobody else."""


class CertificateSource(enum.StrEnum):
    OPERATOR = "operator"
    CERT_MANAGER = "cert-manager"


class InvalidSecurity(ValueError):
    """``spec.security`` cannot be run (a policy the servers would refuse, a reserved role
    name); the message names the place."""


@dataclass(frozen=True)
class SecuritySpec:
    """``spec.security`` of a SegtxnCluster, with its defaults (the CRD's)."""

    enabled: bool = False
    certificates: CertificateSource = CertificateSource.OPERATOR
    issuer: Mapping[str, str] | None = None
    """cert-manager: the issuer of the servers' certificates; None: a CA of the cluster's
    own, bootstrapped by a self-signed issuer (:func:`cert_manager_objects`)."""
    certificate_days: int = 365
    renew_before_days: int = 30
    token_days: int = 365
    protect_metrics: bool = False
    client_certificates: bool = False
    """Mutual TLS (``--tls-client-ca``): each role's token Secret also holds a client
    certificate (:mod:`.credentials`)."""
    superusers: tuple[str, ...] = ()
    roles: Mapping[str, Sequence[Mapping[str, Any]]] | None = None

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> SecuritySpec:
        """From a SegtxnCluster's spec; not checked (rendering a refused spec must not
        fail: the status timer renders it too). :meth:`policy` checks."""
        raw = spec.get("security") or {}
        manager = raw.get("certManager") or {}
        return cls(
            enabled=bool(raw.get("enabled", False)),
            certificates=CertificateSource(raw.get("certificates", "operator")),
            issuer=dict(manager["issuerRef"]) if manager.get("issuerRef") else None,
            certificate_days=int(raw.get("certificateDays", 365)),
            renew_before_days=int(raw.get("renewBeforeDays", 30)),
            token_days=int(raw.get("tokenDays", 365)),
            protect_metrics=bool(raw.get("protectMetrics", False)),
            client_certificates=bool(raw.get("clientCertificates", False)),
            superusers=tuple(str(r) for r in raw.get("superusers") or ()),
            roles=dict(raw.get("roles") or {}),
        )

    def policy_data(self) -> Obj:
        """The policy the servers read: the cluster role a superuser, the admin role
        ``admin`` on ``*``, then the spec's own superusers and roles."""
        roles: Obj = {ADMIN_ROLE: [{"resource": "*", "actions": ["admin"]}]}
        for name, grants in (self.roles or {}).items():
            roles[name] = [dict(g) for g in grants]
        return {"superusers": [CLUSTER_ROLE, *self.superusers], "roles": roles}

    def check(self) -> None:
        """Refuse what the CRD's own rules refuse (for API servers that do not run CEL,
        and because the role names are checked here only: a regex over a map's keys costs
        the API server more than a CRD's rule may, docs/kubernetes.md).

        The role names are checked switch on or off, as the CRD's rule on them always was.
        The renewal window and client certificates only with security on, where they do
        harm: a cluster admitted before the CRD refused them, with security off, must not
        be refused by an operator upgrade.

        Raises:
            InvalidSecurity: a role name that is not a DNS label of at most
                :data:`MAX_ROLE_NAME` characters, or reserved; more than :data:`MAX_ROLES`
                roles; with security on, a renewal window not shorter than what it renews
                (everything would be due as soon as issued, and re-issued on every renewal
                pass), or client certificates from cert-manager.
        """
        for role in (*self.superusers, *(self.roles or {})):
            if len(role) > MAX_ROLE_NAME or not ROLE_NAME.fullmatch(role):
                raise InvalidSecurity(
                    f"{FIELD}: role name {role!r} is not a DNS label of at most "
                    f"{MAX_ROLE_NAME} characters (lower-case letters, digits and '-'; it "
                    "names the role's token Secret)"
                )
            if role in RESERVED:
                raise InvalidSecurity(f"{FIELD}: role {role!r} is reserved for the operator")
        if len(self.roles or {}) > MAX_ROLES:
            raise InvalidSecurity(f"{FIELD}.roles: at most {MAX_ROLES} roles")
        if not self.enabled:
            return
        for field, days in (("certificateDays", self.certificate_days),
                            ("tokenDays", self.token_days)):  # fmt: skip
            if self.renew_before_days >= days:
                raise InvalidSecurity(
                    f"{FIELD}.renewBeforeDays ({self.renew_before_days}) must be below "
                    f"{field} ({days}): else everything is due for renewal as soon as it "
                    "is issued, and is re-issued on every renewal pass"
                )
        if self.client_certificates and self.certificates is not CertificateSource.OPERATOR:
            raise InvalidSecurity(
                f"{FIELD}.clientCertificates: needs certificates: operator (the roles' "
                "client certificates are issued by the operator's CA)"
            )

    def policy(self) -> Policy:
        """The policy, checked as the servers will check it (and :meth:`check`).

        Raises:
            InvalidSecurity: :meth:`check` refuses the spec, or a grant the servers would
                refuse.
        """
        self.check()
        try:
            return Policy.parse(self.policy_data(), FIELD)
        except AuthConfigError as e:
            raise InvalidSecurity(str(e)) from e

    def token_roles(self) -> list[str]:
        """The roles the operator keeps a token Secret for (the cluster role's token is in
        :func:`auth_secret` instead, mounted by the servers)."""
        return sorted({ADMIN_ROLE, *self.superusers, *(self.roles or {})})


def check(spec: Mapping[str, Any]) -> None:
    """:meth:`SecuritySpec.check` of a SegtxnCluster's spec.

    Raises:
        InvalidSecurity: as :meth:`SecuritySpec.check`.
    """
    SecuritySpec.of(spec).check()


def enabled(spec: Mapping[str, Any]) -> bool:
    return SecuritySpec.of(spec).enabled


def scheme(spec: Mapping[str, Any]) -> str:
    """``https`` for a cluster with security on, else ``http``."""
    return "https" if enabled(spec) else "http"


def config_data(spec: Mapping[str, Any]) -> dict[str, str]:
    """The cluster ConfigMap's security keys: the rendered policy, only when on."""
    sec = SecuritySpec.of(spec)
    if not sec.enabled:
        return {}
    return {POLICY_KEY: json.dumps(sec.policy_data(), sort_keys=True, indent=1)}


# ---------------------------------------------------------------------- names


def ca_secret(cluster: str) -> str:
    """The cluster CA (``tls.crt``, ``tls.key``, ``ca.crt``); never mounted."""
    return f"{cluster}-ca"


def broker_tls_secret(cluster: str) -> str:
    return f"{cluster}-broker-tls"


def coordinator_tls_secret(coordinator: str) -> str:
    """The certificate of a TransactionCoordinator's coordinators."""
    return f"{coordinator}-coordinator-tls"


def signer_secret(cluster: str) -> str:
    """The token signing key (``private.pem``); the operator's alone, never mounted."""
    return f"{cluster}-token-signer"


def auth_secret(cluster: str) -> str:
    """What the servers mount: ``public.pem`` (tokens' check) and ``cluster.jwt``."""
    return f"{cluster}-auth"


def token_secret(cluster: str, role: str) -> str:
    """A role's token (``token``) and the CA to verify the servers with (``ca.crt``)."""
    return f"{cluster}-token-{role}"


def broker_dns_names(cluster: str, namespace: str) -> list[str]:
    """The brokers' certificate names: their Service, each pod through the headless
    Service (``*.`` covers one label: the pod name), and ``localhost`` for
    ``kubectl port-forward``."""
    client, headless = f"{cluster}-broker", f"{cluster}-broker-headless"
    return [
        *_service_names(client, namespace),
        f"*.{headless}.{namespace}.svc",
        f"*.{headless}.{namespace}.svc.cluster.local",
        *_service_names(headless, namespace),
        "localhost",
    ]


def coordinator_dns_names(coordinator: str, namespace: str) -> list[str]:
    """A TransactionCoordinator's certificate names: its Service, and its pods' DNS names
    (``<ip with dashes>.<namespace>.pod``: a Deployment's pods have no other stable
    name; :func:`pod_dns_domain`), and ``localhost``."""
    return [
        *_service_names(f"{coordinator}-coordinator", namespace),
        f"*.{pod_dns_domain(namespace)}",
        f"*.{pod_dns_domain(namespace)}.cluster.local",
        "localhost",
    ]


def pod_dns_domain(namespace: str) -> str:
    """Where Kubernetes' DNS names pods by their address (``10-1-2-3.<ns>.pod``)."""
    return f"{namespace}.pod"


def _service_names(service: str, namespace: str) -> list[str]:
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


# ---------------------------------------------------------------------- servers


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


# ---------------------------------------------------------------------- cert-manager

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
