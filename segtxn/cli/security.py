"""The servers' ``--auth-*`` flags (``segtxn broker``, ``coordinator``, ``standalone``): token
authentication and authorization, parsed once into :class:`~segtxn.auth.AuthSettings`
(docs/security.md). None given: security off, as before these flags existed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from segtxn.auth import AuthConfigError, AuthSettings

F = TypeVar("F", bound=Callable[..., Any])

_FILE = click.Path(dir_okay=False, path_type=Path)


def auth_options(command: F) -> F:
    """``--auth-*``: token authentication and authorization (docs/security.md); all absent:
    security off."""
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
    ]
    for option in reversed(options):
        command = option(command)
    return command


def auth_settings(
    auth_token_secret: Path | None,
    auth_public_key: Path | None,
    auth_policy: Path | None,
    auth_cluster_token: Path | None,
    auth_protect_metrics: bool,
) -> AuthSettings:
    """The servers' security settings from the ``--auth-*`` flags.

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
        )
    except AuthConfigError as e:
        raise click.UsageError(f"security: {e}") from e
