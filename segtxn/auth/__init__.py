"""Who may call a broker or coordinator: signed tokens (JWT) name a role, a policy file
maps roles to actions per tenant and namespace, and every endpoint is classified
(docs/security.md). Off unless a server is given a key and a policy."""

from segtxn.auth.certroles import CertRole
from segtxn.auth.endpoints import Kind, Rule, rule_for
from segtxn.auth.guard import (
    AuthSettings,
    authorize,
    check_owner,
    close_at_expiry,
    current_principal,
    install_auth,
    principal_of,
    recheck,
    require,
)
from segtxn.auth.policy import EVERY_SUBSCRIPTION, Action, Grant, Policy, Scope
from segtxn.auth.tls import ServerCertificate, TlsSettings, client_context
from segtxn.auth.tokens import AuthConfigError, Principal, TokenVerifier

__all__ = [
    "EVERY_SUBSCRIPTION",
    "Action",
    "AuthConfigError",
    "AuthSettings",
    "CertRole",
    "Grant",
    "Kind",
    "Policy",
    "Principal",
    "Rule",
    "Scope",
    "ServerCertificate",
    "TlsSettings",
    "TokenVerifier",
    "authorize",
    "check_owner",
    "client_context",
    "close_at_expiry",
    "current_principal",
    "install_auth",
    "principal_of",
    "recheck",
    "require",
    "rule_for",
]
