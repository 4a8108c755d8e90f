"""The etcd engine's credentials, read from their files and read again when they change.

A server's store credentials (:class:`~segtxn.metastore.settings.StoreCredentials`: the
CA, the client certificate and key, the user's password file) are files a Kubernetes
Secret mounts; a renewed certificate or a changed password is written into them while the
server runs. :class:`LiveCredentials` holds what was last loaded and, at most every
``reload_check_s`` (5 s; :class:`~segtxn.metastore.settings.StoreCredentials`), compares
the files' modification times, sizes and inodes (a Secret update swaps a symlink) with the
last load's. When one changed it loads them all again and checks them together, as at
start-up: a set that loads replaces the old one (the engine opens new connections when the
TLS files changed, and authenticates with the new password from its next authentication
on); a set that does not (a Secret rewritten one file at a time,
a key that does not go with its certificate yet) is logged at WARNING once per change and
the old one stays in use.

The check runs when the engine is about to make a call, not on a timer of its own: a stat
of up to four files every few seconds of traffic, nothing at all without it.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from segtxn.filestamps import Stamp, stamp
from segtxn.metastore.errors import InvalidArgument
from segtxn.metastore.settings import StoreCredentials

log = logging.getLogger(__name__)


class LiveCredentials:
    """The gRPC channel credentials (None: plain text) and the password (empty without a
    user) in force, loaded from ``credentials``' files.

    Raises:
        InvalidArgument: (when made) the files do not load; the message names the file.
    """

    def __init__(self, credentials: StoreCredentials) -> None:
        credentials.check()
        self._credentials = credentials
        self._every_s = credentials.reload_check_s
        self._files = [
            p
            for p in (
                credentials.ca_file,
                credentials.cert_file,
                credentials.key_file,
                credentials.password_file,
            )
            if p is not None
        ]
        self._pem, self.tls, self.password = _load(credentials)
        self._seen = stamp(self._files)
        self._refused: Stamp | None = None
        self._next_check = time.monotonic() + self._every_s
        self.reloads = 0
        """How many times new files were loaded."""
        self.tls_reloads = 0
        """How many of those changed the TLS files (the engine's channel is made again)."""

    def check(self) -> bool:
        """Load the files again if they changed since the last load (looked at no more
        often than every ``reload_check_s``); whether a new set is now in force."""
        now = time.monotonic()
        if now < self._next_check or not self._files:
            return False
        self._next_check = now + self._every_s
        stamped = stamp(self._files)
        if stamped in (self._seen, self._refused):
            return False
        try:
            pem, self.tls, self.password = _load(self._credentials)
        except InvalidArgument as e:
            self._refused = stamped
            log.warning("metadata store: keeping the current credentials: %s", e)
            return False
        self._seen, self._refused = stamped, None
        self.reloads += 1
        if pem != self._pem:
            self._pem = pem
            self.tls_reloads += 1
        log.info("metadata store: loaded new credentials from %s", self._files[0].parent)
        return True


Pem = tuple[bytes | None, bytes | None, bytes | None]


def _load(credentials: StoreCredentials) -> tuple[Pem, grpc.ChannelCredentials | None, str]:
    """The files' PEM (CA, key, certificate), as gRPC credentials, and the password,
    checked as far as can be without connecting: PEM, and a client certificate that goes
    with its key.

    Raises:
        InvalidArgument
    """
    password = credentials.password() if credentials.user is not None else ""
    if not credentials.tls:
        return (None, None, None), None, password
    ca, key, cert = pem = credentials.pem()
    if cert is not None and key is not None:
        _check_pair(cert, key, credentials.cert_file)
    return pem, grpc.ssl_channel_credentials(ca, key, cert), password


def _check_pair(cert: bytes, key: bytes, where: Path | None) -> None:
    """gRPC takes any bytes and fails the handshake later: say now whether the key is the
    certificate's (their public halves compared; in memory, since a server's root
    filesystem is read-only on Kubernetes).

    Raises:
        InvalidArgument: they do not load, or do not go together.
    """
    try:
        public = x509.load_pem_x509_certificate(cert).public_key()
        private = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError) as e:
        raise InvalidArgument(f"{where}: not a certificate and its key ({e})") from e
    der, spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if public.public_bytes(der, spki) != private.public_key().public_bytes(der, spki):
        raise InvalidArgument(f"{where}: not a certificate and its key (another key's)")
