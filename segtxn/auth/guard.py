"""Authentication and authorization on a broker's or coordinator's aiohttp application.

:class:`AuthSettings` is what a server is given (parsed once at start-up from its files);
:func:`install_auth` puts the :func:`authenticate` middleware on an application, after the
error boundary, so its refusals get the JSON error shape. Off (no key, no client CA) it
installs nothing and every request passes as before: a server started without ``--auth-*``
flags behaves exactly as one built before this module existed.

On, each request's route is looked up in :mod:`segtxn.auth.endpoints`: open routes pass;
every other one needs ``Authorization: Bearer <token>`` (a WebSocket's on its upgrade
request: refused before the upgrade, as an HTTP answer) or, when the server takes roles
from client certificates, a certificate (:mod:`segtxn.auth.certroles`; a token wins):
401 ``Unauthenticated`` without credentials that verify, 403 ``NotAuthorized`` when their
role may not. The request then carries its :class:`Principal` (:func:`principal_of`) for
the checks only a handler can make: whose transaction a call names (:func:`check_owner`),
which topics a body lists (:func:`require`).

Servers call each other as the *cluster role*: :meth:`AuthSettings.cluster_session` puts
its token (read from a file) on their internal HTTP sessions; the policy must make it a
superuser, which is checked at start-up and on every reload
(:mod:`segtxn.auth.credentials`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import WSCloseCode, hdrs, web

from segtxn.auth.certroles import CertRole, certificate_role
from segtxn.auth.clientcerts import client_certificates
from segtxn.auth.credentials import RELOAD_CHECK_S, CredentialFiles, LiveCredentials
from segtxn.auth.endpoints import About, Kind, Rule, rule_for
from segtxn.auth.policy import EVERY_SUBSCRIPTION, Action, Policy, Scope
from segtxn.auth.tls import TlsSettings
from segtxn.auth.tokens import LEEWAY_S, AuthConfigError, Principal, TokenVerifier, bearer_token
from segtxn.boundary import Handler, error_response
from segtxn.protocol.auth import bearer_middleware
from segtxn.protocol.errors import ErrorName, ServerError

PRINCIPAL = web.RequestKey("segtxn-principal", Principal)
"""Who a request comes from, once authenticated (absent with security off)."""
RULE = web.RequestKey("segtxn-rule", Rule)
"""The rule a request was let through by (for :func:`recheck`)."""
PASSED = web.RequestKey("segtxn-passed", Policy)
"""The policy a request last passed its rule under (:func:`recheck` checks again only
under another one)."""


@dataclass(frozen=True)
class AuthSettings:
    """A server's security settings. The default is off: no key, nothing checked."""

    credentials: LiveCredentials | None = None
    """The key, policy and cluster token in force, reloaded when their files change;
    None: tokens off."""
    protect_metrics: bool = False
    """``/metrics`` needs ``admin`` on ``*`` (else it is open, as the probes)."""
    tls: TlsSettings = field(default_factory=TlsSettings)
    """The listener's certificate, and the CA other servers are checked against."""
    cert_role: CertRole | None = None
    """Take a request's role from its client certificate when it has no token (None: a
    token is needed): :mod:`segtxn.auth.certroles`."""

    @property
    def enabled(self) -> bool:
        return self.credentials is not None

    @property
    def verifier(self) -> TokenVerifier | None:
        """Checks tokens now; None: security off."""
        return None if self.credentials is None else self.credentials.current.verifier

    @property
    def policy(self) -> Policy:
        """The policy in force (empty with security off)."""
        return _NO_POLICY if self.credentials is None else self.credentials.current.policy

    @property
    def cluster_token(self) -> str | None:
        """The token this server presents to other servers now."""
        return None if self.credentials is None else self.credentials.current.cluster_token

    @classmethod
    def from_files(
        cls,
        *,
        secret_file: Path | None = None,
        public_key_file: Path | None = None,
        policy_file: Path | None = None,
        cluster_token_file: Path | None = None,
        protect_metrics: bool = False,
        tls: TlsSettings | None = None,
        cert_role: CertRole | None = None,
        reload_check_s: float = RELOAD_CHECK_S,
    ) -> AuthSettings:
        """Read and check a server's security files; all None: security off.

        Tokens on need one key (an HS256 secret or a public key), a policy, and the
        cluster role's token, which must verify with that key and name a superuser
        (:class:`~segtxn.auth.credentials.CredentialFiles`); the three are reloaded when
        they change (every ``reload_check_s``). TLS (``tls``) goes with tokens or without
        them. ``cert_role`` (roles from client certificates) needs tokens on and client
        certificates required (``tls.client_ca_file``).

        Raises:
            AuthConfigError: a file missing, unreadable or wrong, or a combination that
                cannot work (two keys, a policy without a key, ...); it says which.
        """
        if secret_file is not None and public_key_file is not None:
            raise AuthConfigError("give an HS256 secret or a public key, not both")
        if secret_file is None and public_key_file is None:
            given = [
                what
                for what, value in (
                    ("a policy", policy_file),
                    ("a cluster token", cluster_token_file),
                    ("protected metrics", protect_metrics or None),
                    ("roles from client certificates", cert_role),
                )
                if value is not None
            ]
            if given:
                raise AuthConfigError(
                    f"{', '.join(given)} without a token key: security needs an HS256 secret "
                    "file or a public key file"
                )
            return cls(tls=_checked(tls))
        if secret_file is not None:  # a bad key is said first, whatever else is missing
            TokenVerifier.from_secret_file(secret_file)
        elif public_key_file is not None:
            TokenVerifier.from_public_key_file(public_key_file)
        if policy_file is None:
            raise AuthConfigError("security needs a policy file (who may do what)")
        if cluster_token_file is None:
            raise AuthConfigError(
                "security needs the cluster role's token file: servers call each other with it"
            )
        files = CredentialFiles(policy_file, cluster_token_file, secret_file, public_key_file)
        credentials = LiveCredentials(files, reload_check_s)
        if cert_role is not None and (tls is None or tls.client_ca_file is None):
            raise AuthConfigError(
                "roles from client certificates need client certificates required: give "
                "--tls-client-ca (the CA that signs them)"
            )
        return cls(credentials, protect_metrics, _checked(tls), cert_role)

    def cluster_session(self, **options: Any) -> aiohttp.ClientSession:
        """An HTTP session for a server's calls to other servers (``options`` go to
        ``aiohttp.ClientSession``): the cluster role's token in force on every request
        when tokens are on; with TLS, their certificates checked against the cluster's CA
        and this server's own presented. Call it in a running event loop.

        Raises:
            AuthConfigError: the TLS files cannot be loaded (they were at start-up).
        """
        middlewares = (
            ()
            if self.credentials is None
            else (bearer_middleware(self.credentials.cluster_token()),)
        )
        context = self.tls.client_context()
        if context is not None:
            options.setdefault("connector", aiohttp.TCPConnector(ssl=context))
        return aiohttp.ClientSession(middlewares=middlewares, **options)


_NO_POLICY = Policy()


def _checked(tls: TlsSettings | None) -> TlsSettings:
    """``tls`` (or none) once its files load: a server must not start and then fail its
    first handshake. Raises AuthConfigError."""
    if tls is None:
        return TlsSettings()
    tls.check()
    tls.server_certificate()
    tls.client_context()
    return tls


AUTH = web.AppKey("segtxn-auth", AuthSettings)


def install_auth(app: web.Application, settings: AuthSettings) -> None:
    """Put authentication on ``app`` (after :func:`segtxn.boundary.install`), and the
    watch that reloads its key, policy and cluster token; before it, with a client CA,
    the refusal of requests without a client certificate
    (:func:`~segtxn.auth.clientcerts.client_certificates`). Nothing is added when
    ``settings`` is off and asks for no client certificates."""
    app[AUTH] = settings
    if settings.tls.client_ca_file is not None:
        app.middlewares.append(client_certificates(settings.protect_metrics))
    if settings.credentials is not None:
        app.middlewares.append(authenticate)
        app.cleanup_ctx.append(settings.credentials.reloading)


def _unauthenticated(request: web.Request, e: ServerError) -> web.Response:
    response = error_response(e, request)
    response.headers[hdrs.WWW_AUTHENTICATE] = 'Bearer realm="segtxn"'
    return response


@web.middleware
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The route's rule, checked before its handler runs (module docstring)."""
    settings = request.app[AUTH]
    resource = request.match_info.route.resource
    if resource is None or settings.verifier is None:  # no route: the 404/405 answers
        return await handler(request)
    rule = rule_for(request.method, resource.canonical, protect_metrics=settings.protect_metrics)
    if rule.kind is Kind.OPEN:
        return await handler(request)
    headers = request.headers.getall(hdrs.AUTHORIZATION, [])
    header = headers[0] if headers else None
    try:
        if len(headers) > 1:  # which one to take is no one's guess (a proxy may check another)
            raise ServerError(
                ErrorName.UNAUTHENTICATED,
                f"the request carries {len(headers)} Authorization headers; send one",
            )
        if header is None and settings.cert_role is not None:  # a token wins over a certificate
            transport = request.transport
            peer = None if transport is None else transport.get_extra_info("peercert")
            role, expires_s = certificate_role(peer, settings.cert_role)
        else:
            role, expires_s = settings.verifier.claims(bearer_token(header))
    except ServerError as e:
        return _unauthenticated(request, e)
    principal = settings.policy.principal(role, expires_s)
    request[PRINCIPAL] = principal
    request[RULE] = rule
    policy = settings.policy
    _check_rule(policy, principal, rule, request.match_info)
    request[PASSED] = policy
    return await handler(request)


def recheck(request: web.Request) -> None:
    """Check the route's rule again under the policy in force now, for a long-lived
    request (a consumer's or reader's WebSocket checks it on every frame it reads): a
    policy reloaded without a restart applies to connections already open. Nothing to do
    with security off or on an open route.

    It costs an attribute read and a comparison while the policy is the one the request
    last passed under; the rule is evaluated again only after a reload.

    Raises:
        ServerError(NotAuthorized): the role may no longer do this.
    """
    principal, rule = request.get(PRINCIPAL), request.get(RULE)
    if principal is None or rule is None:
        return
    policy = request.app[AUTH].policy
    if request.get(PASSED) is policy:  # the same policy as the last check: the same answer
        return
    again = policy.principal(principal.role, principal.expires_s)
    _check_rule(policy, again, rule, request.match_info)
    request[PASSED] = policy


def _check_rule(
    policy: Policy, principal: Principal, rule: Rule, match: web.UrlMappingMatchInfo
) -> None:
    if rule.kind is Kind.AUTHENTICATED:
        return
    if rule.kind is Kind.INTERNAL:
        if not principal.superuser:
            raise ServerError(
                ErrorName.NOT_AUTHORIZED,
                f"role {principal.role!r} may not call this: servers call it, as a superuser",
            )
        return
    scope: Scope = (match["tenant"], match["namespace"]) if rule.kind is Kind.NAMESPACE else None
    subscription = (
        match["subscription"]
        if rule.about is About.PATH
        else EVERY_SUBSCRIPTION
        if rule.about is About.EVERY
        else None
    )
    require(policy, principal, rule.actions, scope, subscription)


def require(
    policy: Policy,
    principal: Principal | None,
    actions: frozenset[Action],
    scope: Scope,
    subscription: str | None = None,
) -> None:
    """Refuse unless ``principal`` may do one of ``actions`` on ``scope`` (and ``consume``
    on ``subscription``, when the call is about one; :meth:`Policy.allows`). No principal:
    security is off.

    Raises:
        ServerError(NotAuthorized): naming the role, the actions, the scope and the
            subscription.
    """
    if principal is None or policy.allows(principal, actions, scope, subscription):
        return
    wanted = " or ".join(sorted(a.value for a in actions))
    where = "the cluster" if scope is None else f"{scope[0]}/{scope[1]}"
    if subscription == EVERY_SUBSCRIPTION:
        where += " without a subscription (a reader needs consume on every subscription)"
    elif subscription is not None:
        where += f" on subscription {subscription!r}"
    raise ServerError(
        ErrorName.NOT_AUTHORIZED, f"role {principal.role!r} may not {wanted} on {where}"
    )


def authorize(
    request: web.Request,
    actions: frozenset[Action],
    scope: Scope,
    subscription: str | None = None,
) -> None:
    """:func:`require` for the caller of ``request`` under its application's policy (a
    check only the handler can make, such as on the topics a body lists).

    Raises:
        ServerError(NotAuthorized)
    """
    require(request.app[AUTH].policy, principal_of(request), actions, scope, subscription)


EXPIRED_REASON = b"Unauthenticated: the token expired"
_EXPIRING: set[asyncio.Task[object]] = set()
"""Closes of WebSockets whose token expired, until they finish (their owner: a close is
short, and the handler's own task is reading the socket meanwhile)."""


def close_at_expiry(request: web.Request, ws: web.WebSocketResponse) -> Callable[[], None]:
    """With tokens on, close ``ws`` when the token it was opened with expires (code 1008,
    ``Unauthenticated: the token expired``): a connection lives no longer than its
    credentials, and the client's reconnect then needs a valid token. Returns what to call
    when the connection ends (it cancels the timer; nothing to do with security off)."""
    principal = principal_of(request)
    if principal is None or principal.expires_s is None:
        return lambda: None
    loop = asyncio.get_running_loop()

    def expire() -> None:
        closing = ws.close(code=WSCloseCode.POLICY_VIOLATION, message=EXPIRED_REASON)
        task: asyncio.Task[object] = loop.create_task(closing, name="ws-token-expired")
        _EXPIRING.add(task)
        task.add_done_callback(_EXPIRING.discard)

    delay_s = max(0.0, principal.expires_s + LEEWAY_S - time.time())
    return loop.call_later(delay_s, expire).cancel


def principal_of(request: web.Request) -> Principal | None:
    """Who sent ``request``; None when security is off (or the route is open)."""
    return request.get(PRINCIPAL)


def current_principal(request: web.Request) -> Principal | None:
    """Who sent ``request``, under the policy in force now: for a long-lived request, whose
    role a reloaded policy may have taken out of the superusers (or put in)."""
    principal = request.get(PRINCIPAL)
    if principal is None:
        return None
    return request.app[AUTH].policy.principal(principal.role, principal.expires_s)


def check_owner(principal: Principal | None, owner: str | None, what: str) -> None:
    """Refuse unless ``principal`` opened the transaction ``what`` (its ``owner``) or is a
    superuser. With security off (no principal) everyone may; a transaction opened with
    security off (no owner) is then a superuser's only.

    Raises:
        ServerError(NotAuthorized): the transaction is another role's.
    """
    if principal is None or principal.superuser or owner == principal.role:
        return
    raise ServerError(
        ErrorName.NOT_AUTHORIZED,
        f"{what} was opened by another role: only that role or a superuser may use it",
    )
