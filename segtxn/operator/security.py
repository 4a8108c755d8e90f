"""A SegtxnCluster's security switch (``spec.security``): what it means, what it renders.

With ``spec.security.enabled`` every broker and coordinator of the cluster serves HTTPS
only, with a certificate of the cluster's own CA, and checks a signed token on every call
(docs/security.md). The operator provides what that takes:

- **Certificates**: by default its own (:mod:`.credentials` keeps a CA per cluster in a
  Secret and issues the servers' certificates from it, renewing them before they expire);
  with ``certificates: cert-manager`` it renders cert-manager ``Issuer``/``Certificate``
  objects instead (:mod:`.certmanager`) and cert-manager writes the same Secrets.
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
rolled by an operator that knows about it.

This module is the switch itself: the spec with its defaults and its checks
(:class:`SecuritySpec`), the roles and the policy. Beside it, each pure: what the Secrets
are called and what the certificates cover (:mod:`.securitynames`), what the servers run
with (:mod:`.secureservers`), cert-manager's objects (:mod:`.certmanager`).
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping, Sequence
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
    own, bootstrapped by a self-signed issuer (:func:`.certmanager.cert_manager_objects`)."""
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
        :func:`.securitynames.auth_secret` instead, mounted by the servers)."""
        return sorted({ADMIN_ROLE, *self.superusers, *(self.roles or {})})


def check(spec: Mapping[str, Any]) -> None:
    """:meth:`SecuritySpec.check` of a SegtxnCluster's spec, and with security on its
    grants as the servers will check them (:meth:`SecuritySpec.policy`): a spec refused
    for them must be refused before anything is applied or scaled down.

    Raises:
        InvalidSecurity: as :meth:`SecuritySpec.policy`.
    """
    sec = SecuritySpec.of(spec)
    if sec.enabled:
        sec.policy()
    else:
        sec.check()


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
