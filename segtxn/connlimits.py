"""How many connections a server (a broker or a coordinator) holds, and for how long.

Every connection holds a file descriptor, and so does every file of a broker's ledgers. With
no bound, a flood of connections (hostile, or a client that leaks them) took every
descriptor the process may open: the broker then failed to accept even its health checks
(``/readyz`` answered nothing) and could not have opened a ledger file, a stall of its
topics for as long as the flood lasted. So a server admits at most ``max_connections`` at
once (by default half of its open-files limit, which it first raises to the hard limit:
the other half stays for its own files; the servers of one process, a standalone's broker
and coordinator, share that half), and optionally ``max_per_ip`` from one address
(off by default, as in Kafka and Pulsar: clients behind one NAT or proxy share an address).
A connection past a limit is answered at once, before its request is read, with segtxn's
JSON error (503 ``ServiceNotReady``, or 429 ``TooManyRequests`` for one address's limit;
both retriable: the client tries again) and closed.

Past ``max_connections``, :data:`PROBE_HEADROOM` more are admitted for health checks and
metrics alone (:data:`PROBE_PATHS`; anything else on them is answered 503 and the connection
closes): a kubelet's probes go through the same limit, and a server at it that failed its
liveness probe would be restarted, its topics moved, by the flood it was refusing.

A connection that has no request in flight for ``idle_timeout_s`` is closed: an HTTP
keep-alive connection between requests, and one that never sends a whole request (it held
its descriptor for an hour, aiohttp's own default, not the 75 s of its ``run_app``). A
WebSocket in use is never idle: its request lasts as long as it does.
"""

from __future__ import annotations

import logging
import resource
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from segtxn.exposition import Metrics
from segtxn.protocol.errors import ErrorName, ServerError

log = logging.getLogger(__name__)

IDLE_TIMEOUT_S = 75.0
"""Default of :attr:`ConnectionLimits.idle_timeout_s` (aiohttp's ``run_app`` default)."""
PROBE_HEADROOM = 16
"""Connections admitted past ``max_connections`` for :data:`PROBE_PATHS` alone."""
PROBE_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
"""What a connection admitted in the :data:`PROBE_HEADROOM` may ask for."""
REFUSALS_SAID_EVERY_S = 10.0
"""Refused connections are logged at WARNING once per this long at most, with their count."""


@dataclass(frozen=True)
class ConnectionLimits:
    """A server's connection limits (see the module docstring).

    Raises:
        ValueError: a limit below 1, or an idle timeout that is not positive.
    """

    max_connections: int | None = None
    """At most this many connections at once; None: half the open-files limit."""
    max_per_ip: int | None = None
    """At most this many from one address at once; None: no such limit."""
    idle_timeout_s: float = IDLE_TIMEOUT_S

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_per_ip"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1 (or None), not {value}")
        if not self.idle_timeout_s > 0:
            raise ValueError(f"idle_timeout_s must be positive, not {self.idle_timeout_s}")


def open_files_limit() -> int:
    """The process's open-files limit, raised to its hard limit first (as servers do: the
    soft limit is often a low default, 1,024, that the hard one allows past). Returns the
    soft limit in force (a large number when there is none)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as e:  # (a hard limit of "unlimited" may be refused)
            log.info("could not raise the open-files limit from %d to %d: %s", soft, hard, e)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


class _Count:
    """Connections open on the gates that share one limit."""

    def __init__(self) -> None:
        self.open = 0


_DEFAULTED = _Count()
"""The count of every gate of this process on the default limit: a standalone runs a broker
and a coordinator in one process, and each taking half the open-files limit left none for
their own files (a ledger, the store's connection)."""


class ConnectionGate:
    """Counts a server's open connections, per address too, and says which to refuse.

    On the default limit (``max_connections`` None), the gates of one process share one
    count against half its open-files limit: the other half stays for its files whatever
    number of servers it runs."""

    def __init__(self, limits: ConnectionLimits, server: str) -> None:
        self.limits = limits
        self._server = server
        files = open_files_limit()
        self.max_connections = limits.max_connections or max(1, files // 2)
        if self.max_connections > files:
            log.warning(
                "%s: --max-connections %d is over the open-files limit (%d): connections "
                "may take every descriptor and leave none for the server's own files",
                server, self.max_connections, files,
            )  # fmt: skip
        self._count = _DEFAULTED if limits.max_connections is None else _Count()
        self._per_ip: Counter[str] = Counter()
        self._refused = 0
        self._said_at = float("-inf")
        self.refusals: Counter[str] = Counter()
        """Connections refused so far, per limit (``server``, ``address``)."""
        self._count_refused: Callable[[float, Mapping[str, str]], None] | None = None

    @property
    def open(self) -> int:
        """Connections open on this gate's count (the process's, on the default limit)."""
        return self._count.open

    def register(self, metrics: Metrics) -> None:
        """Show the open connections, the limit and the refusals on ``metrics``."""
        metrics.gauge(
            "segtxn_connections_open",
            "Connections this server holds (--max-connections bounds them)",
            lambda: float(self.open),
        )
        metrics.gauge(
            "segtxn_connections_limit",
            "The most connections this server holds at once (--max-connections)",
            lambda: float(self.max_connections),
        )
        refused = metrics.labelled_count(
            "segtxn_connections_refused_total",
            "Connections answered at once and closed: past the server's limit, or past one "
            "address's (--max-connections-per-ip)",
            ["limit"],
        )
        self._count_refused = refused.add

    def admit(self, address: str | None) -> tuple[ServerError | None, bool]:
        """Count a new connection from ``address`` (None: not an IP connection): returns
        (None, whether it may ask for :data:`PROBE_PATHS` alone: it is in the headroom),
        or (why it is refused, False), nothing counted."""
        refusal: ServerError | None = None
        if self.open >= self.max_connections + PROBE_HEADROOM:
            refusal = self._past_limit()
        elif (
            address is not None
            and self.limits.max_per_ip is not None
            and self._per_ip[address] >= self.limits.max_per_ip
        ):
            refusal = ServerError(
                ErrorName.TOO_MANY_REQUESTS,
                f"{self._server} holds {self._per_ip[address]} connections from {address}, "
                "its limit per address (--max-connections-per-ip); close some or try again "
                "later",
            )
        if refusal is not None:
            self._refuse("server" if refusal.name is ErrorName.SERVICE_NOT_READY else "address")
            self._said(refusal)
            return refusal, False
        self._count.open += 1
        if address is not None:
            self._per_ip[address] += 1
        return None, self.open > self.max_connections

    def full(self) -> ServerError:
        """The refusal of a connection past ``max_connections`` (counted: the caller
        refuses it, at once or its first request that is no probe)."""
        refusal = self._past_limit()
        self._refuse("server")
        self._said(refusal)
        return refusal

    def _past_limit(self) -> ServerError:
        whose = "its" if self._count is not _DEFAULTED else "this process's servers'"
        return ServerError(
            ErrorName.SERVICE_NOT_READY,
            f"{self._server} holds {self.open} connections, past {whose} limit "
            f"(--max-connections {self.max_connections}); try again later",
        )

    def release(self, address: str | None) -> None:
        """A connection :meth:`admit` counted has closed."""
        self._count.open -= 1
        if address is not None:
            self._per_ip[address] -= 1
            if not self._per_ip[address]:
                del self._per_ip[address]

    def _refuse(self, limit: str) -> None:
        self.refusals[limit] += 1
        if self._count_refused is not None:
            self._count_refused(1, {"limit": limit})

    def _said(self, refusal: ServerError) -> None:
        self._refused += 1
        now = time.monotonic()
        if now - self._said_at >= REFUSALS_SAID_EVERY_S:
            log.warning(
                "%s: refused %d connection(s) since the last such line: %s",
                self._server, self._refused, refusal.message,
            )  # fmt: skip
            self._said_at, self._refused = now, 0
