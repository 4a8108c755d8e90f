"""How a failure that is not a bug is named on the wire and logged: the one rule of every
edge of segtxn's servers (:mod:`segtxn.boundary`'s HTTP answers and WebSocket closes, a
broker socket's ``Error`` frames, :mod:`segtxn.broker.sockets`), and of the background
loops that retry (:func:`retry_warning`). Anything it does not name is a bug: an
:func:`incident`, logged with its traceback under an id the answer carries.

Apart from the boundary's middleware because the broker's sockets, its transaction buffer
and its publishing path name failures by the same rule without being HTTP handlers.
"""

from __future__ import annotations

import logging
import time
import uuid

import aiohttp

from segtxn.ledger.errors import LedgerCorrupted, LedgerError, report_once
from segtxn.metastore import (
    SessionExpired,
    StoreAccessDenied,
    StoreClosed,
    StoreFull,
    StoreUnavailable,
)
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.topics.model import DamagedRecord

log = logging.getLogger(__name__)


def incident(what: str, exc: BaseException) -> str:
    """Log a server bug with a fresh incident id and its traceback; returns the id."""
    ident = uuid.uuid4().hex[:12]
    log.error("incident %s: %s", ident, what, exc_info=exc)
    return ident


STORE_FULL_MESSAGE = (
    "the metadata store is full and refuses every write (etcd's NOSPACE alarm: its database "
    "reached --quota-backend-bytes). An operator must compact and defragment etcd (etcdctl "
    "compact, etcdctl defrag) or raise its quota, then disarm the alarm (etcdctl alarm disarm)"
)
STORE_FULL_LOG_EVERY_S = 600.0
"""A full store is logged at ERROR at most this often (every request meets it)."""


class Throttled:
    """An ERROR line for a condition every request meets while it lasts: written the first
    time, then at most once per ``every_s`` (with how many times it was met in between);
    the other times at DEBUG."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._last: float | None = None
        self._since = 0

    @property
    def since(self) -> int:
        """How many times the condition was met since it was last logged at ERROR."""
        return self._since

    def report(self, message: str) -> None:
        now = time.monotonic()
        if self._last is not None and now - self._last < self.every_s:
            self._since += 1
            log.debug("%s (again)", message)
            return
        repeats = f" ({self._since} more time(s) since it was last logged)" if self._since else ""
        log.error("%s%s", message, repeats)
        self._last, self._since = now, 0


STORE_FULL_LOG = Throttled(STORE_FULL_LOG_EVERY_S)


def retry_warning(logger: logging.Logger, error: Exception, message: str, *args: object) -> None:
    """Log one failed attempt of a background loop that retries (a clean-up, a cursor save):
    at WARNING, except a full store, which every such loop meets every second while it
    lasts: that goes to :data:`STORE_FULL_LOG` (one ERROR line for the whole server, with
    what to do) and the loop's own line to DEBUG, so a full store does not flood the log."""
    if isinstance(error, StoreFull):
        STORE_FULL_LOG.report(f"{STORE_FULL_MESSAGE}; the store said: {error}")
        logger.debug(message, *args)
        return
    logger.warning(message, *args)


STORE_DENIED_MESSAGE = (
    "the metadata store refuses this server's credentials or permissions; an operator must "
    "restore them (the etcd user's role and its read-write permission on the cluster's key "
    "prefix, its password: --store-user, --store-password-file)"
)


def translate(e: Exception) -> ServerError | None:
    """The wire error for a failure that is not a bug (see the module docstring), or
    None."""
    if isinstance(e, StoreFull):
        STORE_FULL_LOG.report(f"{STORE_FULL_MESSAGE}; the store said: {e}")
        return ServerError(ErrorName.METADATA_STORE_FULL, STORE_FULL_MESSAGE)
    if isinstance(e, StoreAccessDenied):
        return ServerError(ErrorName.STORE_ACCESS_DENIED, f"{STORE_DENIED_MESSAGE}: {e}")
    if isinstance(e, StoreUnavailable | StoreClosed | SessionExpired):
        return ServerError(ErrorName.SERVICE_NOT_READY, f"metadata store: {e}")
    if isinstance(e, aiohttp.ClientError | TimeoutError):
        return ServerError(ErrorName.SERVICE_NOT_READY, f"a peer did not answer: {e!r}")
    if isinstance(e, LedgerCorrupted | DamagedRecord):  # (its message names the file, the key)
        report_once(log, e, "refused: stored data is damaged, missing or not its own: %s", e)
        return ServerError(ErrorName.PERSISTENCE, str(e))
    return None


def known(e: Exception, what: str) -> ServerError | None:
    """The wire error for a failure that is not a bug, or None: :func:`translate`'s, and a
    ledger's retriable error (too few replicas, a full disk, a write or a cursor's save
    that met a fence) as ServiceNotReady, logged at WARNING naming ``what`` (the request,
    the frame) without a traceback. The one rule of every edge (an HTTP answer, a close
    after an upgrade, a broker socket's ``Error`` frame), so they cannot drift: the frame
    path had its own, and answered a retriable ledger error ``UnknownError``."""
    wire = translate(e)
    if wire is None and isinstance(e, LedgerError) and e.retriable:
        log.warning("%s: %s: %s", what, type(e).__name__, e)
        wire = ServerError(ErrorName.SERVICE_NOT_READY, str(e))
    return wire
