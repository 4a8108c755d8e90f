"""TLS on a server's listener, and for the calls servers make to each other.

A server given a certificate chain and its key (files a Kubernetes Secret mounts) serves
HTTPS only. The files are watched: every :data:`RELOAD_CHECK_S` the server looks at their
modification times and, when either changed, loads them again into the same
``ssl.SSLContext``, so new connections get the new certificate without a restart (open
connections keep the one they started with). A pair that does not load (a Secret being
rewritten one file at a time, a key that does not match) is logged at WARNING and the old
certificate stays in use until a later check loads the pair.

With ``client_ca_file``, the server also asks every client for a certificate signed by that
CA: a certificate that does not verify fails the handshake, and a connection that presented
none is refused on every route but the probes (:mod:`segtxn.auth.clientcerts`, which says
why not at the handshake). Mutual TLS at the transport: who the client *is* still comes
from its token, unless the server takes roles from certificates.

Servers calling each other verify the other server's certificate against ``ca_file`` (the
cluster's CA; without it the system's CAs), and present their own certificate, which a
server with ``client_ca_file`` requires.

The checks read two file stats on the event loop, and a reload reads two small files there
too: microseconds, and only when they changed. Loading on the loop also keeps a reload from
racing a handshake, which runs on the loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from segtxn.auth.tokens import AuthConfigError
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
        server's own presented.

        Raises:
            AuthConfigError: a CA file or the server's own pair cannot be loaded.
        """
        if self.cert_file is None or self.key_file is None:
            return None
        return client_context(self.ca_file, self.cert_file, self.key_file)


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
        self._cert = settings.cert_file
        self._key = settings.key_file
        self._every_s = settings.reload_check_s
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        if settings.client_ca_file is not None:
            try:
                self.context.load_verify_locations(cafile=settings.client_ca_file)
            except (OSError, ssl.SSLError) as e:
                raise AuthConfigError(
                    f"{settings.client_ca_file}: not a CA certificate file ({ssl_reason(e)})"
                ) from e
            # A certificate is checked when presented; none: segtxn.auth.clientcerts.
            self.context.verify_mode = ssl.CERT_OPTIONAL
        _load_pair(self.context, self._cert, self._key)
        self._seen = self._stamp()
        self.reloads = 0
        """How many times new files were loaded (tests and logs)."""

    def _stamp(self) -> tuple[float, float] | None:
        try:
            return (os.stat(self._cert).st_mtime, os.stat(self._key).st_mtime)
        except OSError:
            return None

    def check(self) -> bool:
        """Load the files again if they changed since the last load; whether it did.
        A pair that does not load is logged and kept for the next check."""
        stamp = self._stamp()
        if stamp is None or stamp == self._seen:
            return False
        try:
            _load_pair(self.context, self._cert, self._key)
        except AuthConfigError as e:
            log.warning("TLS: keeping the current certificate: %s", e)
            return False
        self._seen = stamp
        self.reloads += 1
        log.info("TLS: loaded a new certificate from %s", self._cert)
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
