"""Reaching the cluster from the command line: ``--url`` (``SEGTXN_URL``), a quick check that
something listens there, and connection failures said in words.

The client waits out a broker that restarts: a call that cannot connect is retried until its
time limit (30 s). A user who typed the wrong port should not wait that long to be told, so
:func:`run` first checks that at least one service URL accepts a TCP connection (a fraction
of a millisecond when one does) and otherwise stops at once: ``cannot reach
http://127.0.0.1:8080: connection refused``. Failures later on (a broker the lookup pointed
to, a connection that broke) are said in words by :func:`connection_failure` and the CLI's
edge (:mod:`segtxn.cli.errors`), never as an aiohttp object's repr.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import click

from segtxn.cli.errors import ServiceUnreachable, unreachable
from segtxn.cli.params import SERVICE_URLS
from segtxn.client import Client
from segtxn.client.credentials import TOKEN_ENV, TOKEN_FILE_ENV
from segtxn.client.unreachable import why_unreachable

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

URL_ENV = "SEGTXN_URL"
URL = click.option(
    "--url",
    default="http://127.0.0.1:8080",
    show_default=True,
    envvar=URL_ENV,
    show_envvar=True,
    type=SERVICE_URLS,
    help="Any broker of the cluster: http://host:port (several: comma-separated).",
)
CREDENTIALS_KEY = "segtxn.credentials"
"""Where the group's ``--token`` and ``--tls-*`` are kept (``click.Context.meta``, shared by
subcommands), as :class:`Client` keyword arguments."""
_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)
"""A credential file: one that is missing is a usage error at once, not a failure at the
first request."""


def credential_options(command: F) -> F:
    """The group's ``--token`` or ``--token-file``, ``--tls-ca``, ``--tls-cert``,
    ``--tls-key`` (given before the command: ``segtxn --token T topics list ...``)."""
    options = [
        click.option(
            "--token",
            default=None,
            envvar=TOKEN_ENV,
            show_envvar=True,
            metavar="JWT",
            help="A signed token for a cluster with security on (sent with every request).",
        ),
        click.option(
            "--token-file",
            type=_FILE,
            envvar=TOKEN_FILE_ENV,
            show_envvar=True,
            help="A file holding the token instead (re-read when it changes).",
        ),
        click.option(
            "--tls-ca",
            type=_FILE,
            envvar="SEGTXN_TLS_CA",
            show_envvar=True,
            help="Check https:// brokers' certificates against this CA (default: the system's).",
        ),
        click.option(
            "--tls-cert",
            type=_FILE,
            envvar="SEGTXN_TLS_CERT",
            show_envvar=True,
            help="A client certificate (PEM) for brokers that require one.",
        ),
        click.option(
            "--tls-key",
            type=_FILE,
            envvar="SEGTXN_TLS_KEY",
            show_envvar=True,
            help="The --tls-cert's key (default: in the same file).",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


CONNECT_CHECK_S = 3.0
"""How long the quick check waits for a service URL to accept a connection."""


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


async def _connects(url: str) -> str | None:
    """None when ``url``'s host and port accept a TCP connection, else why not, in words."""
    host, port = _host_port(url)
    try:
        async with asyncio.timeout(CONNECT_CHECK_S):
            _, writer = await asyncio.open_connection(host, port)
    except TimeoutError:
        return f"no connection within {CONNECT_CHECK_S:g} s"
    except OSError as e:
        return why_unreachable(e)
    writer.close()
    await writer.wait_closed()
    return None


def _hint() -> str:
    return f"is a segtxn broker running there? (--url or {URL_ENV} names another)"


async def check_reachable(urls: str) -> None:
    """Return once one of ``urls`` (comma-separated) accepts a connection.

    Raises:
        ServiceUnreachable: none does; names each and why.
    """
    listed = urls.split(",")
    failures = []
    for url in listed:
        why = await _connects(url)
        if why is None:
            return
        failures.append((url, why))
    if len(failures) == 1:
        url, why = failures[0]
        raise ServiceUnreachable(f"cannot reach {url}: {why}; {_hint()}")
    said = ", ".join(f"{url} ({why})" for url, why in failures)
    raise ServiceUnreachable(f"cannot reach any of {said}; {_hint()}")


def connection_failure(e: BaseException, urls: str) -> ServiceUnreachable | None:
    """``e`` as a :class:`ServiceUnreachable` naming what could not be reached, if it comes
    from a connection that could not be made (to one of ``urls``, or a broker they pointed
    to)."""
    failed = unreachable(e)
    if failed is None:
        return None
    where, why = failed
    for url in urls.split(","):
        host, port = _host_port(url)
        if where == f"{host}:{port}":
            return ServiceUnreachable(f"cannot reach {url}: {why}; {_hint()}")
    return ServiceUnreachable(
        f"cannot reach the broker at {where} (the cluster at {urls} sent this client there): {why}"
    )


def run(body: Callable[[Client], Awaitable[T]], urls: str) -> T:
    """Run ``body`` with a client of ``urls``.

    Raises:
        ServiceUnreachable: no service URL accepts a connection, or a connection could not
            be made later; the CLI's edge reports it, and every other error, in one line.
    """

    ctx = click.get_current_context(silent=True)
    credentials = {} if ctx is None else ctx.meta.get(CREDENTIALS_KEY, {})
    try:
        client = Client(urls, **credentials)
    except ValueError as e:  # a TLS file that does not load
        raise click.UsageError(str(e)) from e

    async def main() -> T:
        await check_reachable(urls)
        async with client:
            return await body(client)

    try:
        return asyncio.run(main())
    except Exception as e:
        failure = connection_failure(e, urls)
        if failure is None:
            raise
        raise failure from e
