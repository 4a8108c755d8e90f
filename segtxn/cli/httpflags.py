"""The server commands' flags about serving HTTP: ``--access-log``, and the connection limits
``--max-connections``, ``--max-connections-per-ip`` and ``--idle-timeout``, passed to the
command as one ``connections`` (:mod:`segtxn.connlimits`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from segtxn.cli.params import COUNT, SECONDS
from segtxn.connlimits import IDLE_TIMEOUT_S, ConnectionLimits
from segtxn.web import ACCESS_LOGGER

F = TypeVar("F", bound=Callable[..., None])

ACCESS_LOG = click.option(
    "--access-log",
    is_flag=True,
    help=f"Log every HTTP request at INFO (logger {ACCESS_LOGGER}; off by default).",
)
"""``--access-log``, passed to the command as ``access_log`` (the servers take it)."""


def connection_options(command: F) -> F:
    """Add the three flags to a server command; it receives ``connections``."""

    @click.option(
        "--max-connections",
        type=COUNT,
        default=0,
        show_default=True,
        metavar="N",
        help="Connections held at once; past them, 16 more are served health checks and "
        "metrics alone, and a new one is answered 503 ServiceNotReady and closed (the client "
        "tries again). 0: half the open-files limit (raised to its hard limit at start-up; a "
        "standalone's two servers share it), the other half staying for the server's own "
        "files.",
    )
    @click.option(
        "--max-connections-per-ip",
        type=COUNT,
        default=0,
        show_default=True,
        metavar="N",
        help="Connections held at once from one address; past them a new one is answered "
        "429 TooManyRequests and closed. 0: no such limit (clients behind one NAT or proxy "
        "share an address).",
    )
    @click.option(
        "--idle-timeout",
        type=SECONDS,
        default=IDLE_TIMEOUT_S,
        show_default=True,
        metavar="SECONDS",
        help="Close a connection that has had no request in flight this long (one between "
        "HTTP requests, or one that never sends a whole request; a WebSocket in use is "
        "never idle). Keep it above the clients' own keep-alive (segtxn's client: 15 s), "
        "or a client may reuse a connection just as it is closed.",
    )
    @functools.wraps(command)
    def wrapped(
        *args: Any,
        max_connections: int,
        max_connections_per_ip: int,
        idle_timeout: float,
        **kwargs: Any,
    ) -> None:
        connections = ConnectionLimits(
            max_connections=max_connections or None,
            max_per_ip=max_connections_per_ip or None,
            idle_timeout_s=idle_timeout,
        )
        command(*args, connections=connections, **kwargs)

    return wrapped  # type: ignore[return-value]
