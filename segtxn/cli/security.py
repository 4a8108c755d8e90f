"""The servers' ``--auth-*``, ``--tls-*`` and ``--store-*`` flags (``segtxn broker``,
``coordinator``, ``standalone``): token authentication and authorization, TLS on the
listener, and TLS and a user for the metadata store connection, parsed once into
:class:`~segtxn.auth.AuthSettings` and :class:`~segtxn.metastore.StoreCredentials`
(docs/security.md). None given: security off, as before these flags existed."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import click

from segtxn.auth import AuthConfigError, AuthSettings, CertRole, TlsSettings
from segtxn.metastore import InvalidArgument, StoreCredentials

F = TypeVar("F", bound=Callable[..., Any])

_FILE = click.Path(dir_okay=False, path_type=Path)


def auth_options(command: F) -> F:
    """``--auth-*``: token authentication and authorization (docs/security.md), and the
    :func:`store_options`; all absent: security off."""
    options = [
        click.option(
            "--auth-token-secret",
            type=_FILE,
            metavar="FILE",
            help="Verify tokens with this HS256 secret (at least 32 bytes). Turns security on.",
        ),
        click.option(
            "--auth-public-key",
            type=_FILE,
            metavar="FILE",
            help="Verify tokens with this PEM public key (RSA: RS256; EC: ES256). Turns "
            "security on.",
        ),
        click.option(
            "--auth-policy",
            type=_FILE,
            metavar="FILE",
            help="Roles and what they may do (YAML or JSON); needed with security on.",
        ),
        click.option(
            "--auth-cluster-token",
            type=_FILE,
            metavar="FILE",
            help="The token this server presents to other servers (a superuser's); needed "
            "with security on.",
        ),
        click.option(
            "--auth-protect-metrics",
            is_flag=True,
            help="/metrics needs a token with admin on '*' (else it is open, like the probes).",
        ),
        click.option(
            "--auth-cert-role",
            type=click.Choice([r.value for r in CertRole]),
            help="Without a token, take the role from the client certificate: its subject's "
            "common name, or its first URI or e-mail alternative name (needs --tls-client-ca).",
        ),
        click.option(
            "--tls-cert",
            type=_FILE,
            metavar="FILE",
            help="Serve HTTPS with this certificate chain (PEM; reloaded when it changes).",
        ),
        click.option("--tls-key", type=_FILE, metavar="FILE", help="The --tls-cert's key (PEM)."),
        click.option(
            "--tls-ca",
            type=_FILE,
            metavar="FILE",
            help="Check other servers' certificates against this CA (default: the system's).",
        ),
        click.option(
            "--tls-client-ca",
            type=_FILE,
            metavar="FILE",
            help="Require client certificates signed by this CA (mutual TLS).",
        ),
    ]
    command = store_options(command)  # (listed after the others, as before)
    for option in reversed(options):
        command = option(command)
    return command


def store_options(command: F) -> F:
    """``--store-*``: TLS and a user for the etcd connection (:func:`store_credentials`
    parses them); all absent: plaintext, no user."""
    options = [
        click.option(
            "--store-ca",
            type=_FILE,
            metavar="FILE",
            help="Connect to etcd with TLS and check its certificate against this CA.",
        ),
        click.option(
            "--store-cert",
            type=_FILE,
            metavar="FILE",
            help="A client certificate (PEM) for an etcd with --client-cert-auth.",
        ),
        click.option("--store-key", type=_FILE, metavar="FILE", help="The --store-cert's key."),
        click.option("--store-user", metavar="NAME", help="Authenticate to etcd as this user."),
        click.option(
            "--store-password-file",
            type=_FILE,
            metavar="FILE",
            help="The --store-user's password (the file's first line).",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def check_scheme(auth: AuthSettings, url: str, flag: str) -> None:
    """Refuse an ``http://`` URL to advertise for a server that serves HTTPS (or the
    reverse): clients would be sent where they cannot connect.

    Raises:
        click.UsageError
    """
    wanted = "https" if auth.tls.enabled else "http"
    if not url.startswith(f"{wanted}://"):
        why = "it serves HTTPS (--tls-cert)" if auth.tls.enabled else "it has no --tls-cert"
        raise click.UsageError(f"{flag} must be a {wanted}:// URL: {why}")


def store_credentials(flags: dict[str, Any], store_url: str) -> StoreCredentials:
    """Take the ``--store-*`` flags out of ``flags`` (the rest are :func:`auth_settings`'s)
    as the store connection's credentials, checked now (the password file read once).

    Raises:
        click.UsageError: flags that do not go together, a file that cannot be read, or
            credentials for a ``memory://`` store.
    """
    credentials = StoreCredentials(
        ca_file=flags.pop("store_ca"),
        cert_file=flags.pop("store_cert"),
        key_file=flags.pop("store_key"),
        user=flags.pop("store_user"),
        password_file=flags.pop("store_password_file"),
    )
    if not credentials.enabled:
        return credentials
    if not store_url.startswith("etcd:"):
        raise click.UsageError("--store-* flags are for an etcd:// store")
    try:
        credentials.check()
        credentials.pem()
        if credentials.user is not None:
            credentials.password()
    except InvalidArgument as e:
        raise click.UsageError(f"store: {e}") from e
    return credentials


def pod_dns_url(url: str, domain: str) -> str:
    """``url`` with its host, an IP address, as Kubernetes' DNS name of the pod that has it
    (``https://10.1.2.3:8081`` and ``ns.pod``: ``https://10-1-2-3.ns.pod:8081``). The
    operator starts coordinators so (``--pod-dns``): their certificate covers
    ``*.ns.pod``, which no single IP address could.

    Raises:
        click.BadParameter: the host is not an IP address, or the domain is empty.
    """
    parts = urlsplit(url)
    try:
        address = ipaddress.ip_address(parts.hostname or "")
    except ValueError:
        raise click.BadParameter(
            f"--advertise {url}: the host must be an IP address with --pod-dns",
            param_hint="--pod-dns",
        ) from None
    domain = domain.strip(".")
    if not domain:
        raise click.BadParameter("an empty domain", param_hint="--pod-dns")
    dashed = str(address).replace(".", "-").replace(":", "-")
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{dashed}.{domain}{port}"


def auth_settings(
    *,
    auth_token_secret: Path | None,
    auth_public_key: Path | None,
    auth_policy: Path | None,
    auth_cluster_token: Path | None,
    auth_protect_metrics: bool,
    auth_cert_role: str | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    tls_ca: Path | None,
    tls_client_ca: Path | None,
) -> AuthSettings:
    """The servers' security settings from the ``--auth-*`` and ``--tls-*`` flags.

    Raises:
        click.UsageError: a file that cannot be used, or flags that do not go together.
    """
    try:
        return AuthSettings.from_files(
            secret_file=auth_token_secret,
            public_key_file=auth_public_key,
            policy_file=auth_policy,
            cluster_token_file=auth_cluster_token,
            protect_metrics=auth_protect_metrics,
            tls=TlsSettings(tls_cert, tls_key, tls_ca, tls_client_ca),
            cert_role=None if auth_cert_role is None else CertRole(auth_cert_role),
        )
    except AuthConfigError as e:
        raise click.UsageError(f"security: {e}") from e
