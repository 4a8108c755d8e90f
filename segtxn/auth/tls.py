"""TLS on a server's listener, and for the calls servers make to each other.

A server given a certificate chain and its key (files a Kubernetes Secret mounts) serves
HTTPS only. The files are watched: every :data:`RELOAD_CHECK_S` the server looks at the
modification times, sizes and inodes of its certificate, its key and its CA files (a
Secret update swaps a symlink) and, when any changed, loads them all again and checks them
together. A set that loads is in force for new connections without a restart (open
connections keep what they started with); a set that does not (a Secret being rewritten one
file at a time, a key that does not match, a CA file that is not PEM) is logged at WARNING
once per change and the old set stays in use until a later change loads.

- The listener: each handshake is given the context of the set in force (the listening
  context's SNI callback hands it over: called for every handshake, with or without a
  server name), so a new certificate *and* a new client CA apply, and a CA taken out of
  ``client_ca_file`` is no longer trusted.
- With ``client_ca_file``, the server asks every client for a certificate signed by that
  CA: a certificate that does not verify fails the handshake, and a connection that
  presented none is refused on every route but the probes (:mod:`segtxn.auth.clientcerts`,
  which says why not at the handshake). Mutual TLS at the transport: who the client *is*
  still comes from its token, unless the server takes roles from certificates.
- Servers calling each other verify the other server's certificate against ``ca_file``
  (the cluster's CA; without it the system's CAs), and present their own certificate, which
  a server with ``client_ca_file`` requires. Their context is one per server
  (:meth:`TlsSettings.client_context`), reloaded in place by the same watch: a renewed
  certificate is presented from the next connection on and a new ``ca_file``'s CAs are
  trusted from then on, *added* to the ones loaded before (an ``ssl`` client context cannot
  forget a CA: one taken out stays trusted for these calls until a restart).

The checks stat a few files on the event loop, and a reload reads a few small files there
too: microseconds, and only when they changed. Loading on the loop also keeps a reload from
racing a handshake, which runs on the loop.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from segtxn.auth.tokens import AuthConfigError
from segtxn.filestamps import Stamp, stamp
from segtxn.protocol.auth import client_ssl_context, load_pair, ssl_reason

log = logging.getLogger(__name__)

RELOAD_CHECK_S = 5.0
"""How often a server looks for a new certificate or key."""


@dataclass(frozen=True)
class TlsSettings:
    """A server's TLS files; the default is none: plain HTTP, as before."""

    cert_file: Path | None = None
    """Its certificate chain (PEM: the server's certificate first)."""
    key_file: Path | None = None
    ca_file: Path | None = None
    """The CA other servers' certificates are checked against (default: the system's)."""
    client_ca_file: Path | None = None
    """Require client certificates signed by this CA (mutual TLS)."""
    reload_check_s: float = RELOAD_CHECK_S
    _shared: dict[str, ssl.SSLContext] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )
    """The one client context of these settings (:meth:`client_context`)."""

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None

    def check(self) -> None:
        """Raises AuthConfigError: a key without a certificate (or the reverse), or CA files
        without a certificate."""
        if (self.cert_file is None) != (self.key_file is None):
            raise AuthConfigError("TLS needs both a certificate file and its key file")
        if self.cert_file is None and (self.ca_file or self.client_ca_file):
            raise AuthConfigError("a TLS CA without a certificate: give --tls-cert and --tls-key")

    def server_certificate(self) -> ServerCertificate | None:
        """The listener's TLS context (None: plain HTTP).

        Raises:
            AuthConfigError: a file that cannot be read, or a key that does not match.
        """
        if self.cert_file is None or self.key_file is None:
            return None
        return ServerCertificate(self)

    def client_context(self) -> ssl.SSLContext | None:
        """The context for this server's calls to others (None: plain HTTP): their
        certificates checked against ``ca_file`` (default: the system's CAs), this
        server's own presented. The same one every time (the listener's watch reloads it
        in place: module docstring).

        Raises:
            AuthConfigError: a CA file or the server's own pair cannot be loaded.
        """
        if self.cert_file is None or self.key_file is None:
            return None
        if "client" not in self._shared:
            context = client_context(self.ca_file, self.cert_file, self.key_file)
            self._shared["client"] = context
        return self._shared["client"]


def client_context(
    ca_file: Path | None = None, cert_file: Path | None = None, key_file: Path | None = None
) -> ssl.SSLContext:
    """:func:`segtxn.protocol.auth.client_ssl_context`, its errors as AuthConfigError."""
    try:
        return client_ssl_context(ca_file, cert_file, key_file)
    except ValueError as e:
        raise AuthConfigError(str(e)) from e


def _load_pair(context: ssl.SSLContext, cert_file: Path, key_file: Path) -> None:
    try:
        load_pair(context, cert_file, key_file)
    except ValueError as e:
        raise AuthConfigError(str(e)) from e


class ServerCertificate:
    """A listener's ``ssl.SSLContext`` and the watch that reloads its files (module
    docstring). Loaded once when made; :meth:`reloading` keeps it current."""

    def __init__(self, settings: TlsSettings) -> None:
        if settings.cert_file is None or settings.key_file is None:
            raise AuthConfigError("TLS needs both a certificate file and its key file")
        self._settings = settings
        self._cert = settings.cert_file
        candidates = (
            settings.cert_file,
            settings.key_file,
            settings.client_ca_file,
            settings.ca_file,
        )
        self._files = [f for f in candidates if f is not None]
        self._every_s = settings.reload_check_s
        self.context = _listener_context(settings)
        """The listening socket's context: every handshake starts here, and its SNI
        callback hands it :attr:`current`."""
        self.current = self.context
        """The context of the set in force."""
        self.context.sni_callback = self._hand_over
        self._client = settings.client_context()
        self._seen = stamp(self._files)
        self._refused: Stamp | None = None
        self.reloads = 0
        """How many times new files were loaded (tests and logs)."""

    def _hand_over(self, connection: ssl.SSLObject, _name: str | None, _context: object) -> None:
        if self.current is not self.context:
            connection.context = self.current

    def check(self) -> bool:
        """Load the files again if any changed since the last load; whether it did. A
        set that does not load is logged once and kept for the next change."""
        stamped = stamp(self._files)
        if stamped in (self._seen, self._refused) or None in stamped:
            return False
        try:
            current = _listener_context(self._settings)
            if self._client is not None:
                _reload_client(self._client, self._settings)
        except AuthConfigError as e:
            self._refused = stamped
            log.warning("TLS: keeping the current certificate and CAs: %s", e)
            return False
        self.current = current
        self._seen, self._refused = stamped, None
        self.reloads += 1
        log.info("TLS: loaded a new certificate and CAs from %s", self._cert.parent)
        return True

    async def reloading(self, app: web.Application) -> AsyncIterator[None]:
        """For the application's ``cleanup_ctx``: checks the files every
        ``reload_check_s`` while it runs."""

        async def watch() -> None:
            while True:
                await asyncio.sleep(self._every_s)
                self.check()

        task = asyncio.create_task(watch(), name=f"tls-reload-{self._cert.name}")
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def _listener_context(settings: TlsSettings) -> ssl.SSLContext:
    """A listener's context of the files as they are now.

    Raises:
        AuthConfigError: a file that cannot be read or used.
    """
    if settings.cert_file is None or settings.key_file is None:
        raise AuthConfigError("TLS needs both a certificate file and its key file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if settings.client_ca_file is not None:
        _load_ca(context, settings.client_ca_file)
        # A certificate is checked when presented; none: segtxn.auth.clientcerts.
        context.verify_mode = ssl.CERT_OPTIONAL
    _load_pair(context, settings.cert_file, settings.key_file)
    return context


def _load_ca(context: ssl.SSLContext, ca_file: Path) -> None:
    try:
        context.load_verify_locations(cafile=ca_file)
    except (OSError, ssl.SSLError) as e:
        raise AuthConfigError(f"{ca_file}: not a CA certificate file ({ssl_reason(e)})") from e


def _reload_client(context: ssl.SSLContext, settings: TlsSettings) -> None:
    """The server's own pair and ``ca_file``'s CAs loaded again into its client context,
    checked first on a scratch context (a failure leaves ``context`` as it was).

    Raises:
        AuthConfigError
    """
    if settings.cert_file is None or settings.key_file is None:
        raise AuthConfigError("TLS needs both a certificate file and its key file")
    client_context(settings.ca_file, settings.cert_file, settings.key_file)  # all of it loads
    if settings.ca_file is not None:
        _load_ca(context, settings.ca_file)
    _load_pair(context, settings.cert_file, settings.key_file)
