"""The settings of one metadata store client: limits, retries, cache size, timeouts, and
the credentials of its connection (TLS, a user).

Given once, at start-up, to :func:`segtxn.metastore.open_store` (or
:class:`~segtxn.metastore.store.MetadataStore`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from segtxn.metastore.errors import InvalidArgument


@dataclass(frozen=True)
class StoreCredentials:
    """How a store client checks the store and proves who it is: TLS (the store's
    certificate checked against ``ca_file``, a client certificate for a store that requires
    one) and a user name and password (etcd's authentication). The default is none: plain
    connections, no user, as before these settings existed. ``etcd://`` only; the
    ``memory://`` store refuses them.
    """

    ca_file: Path | None = None
    """Connect with TLS and check the store's certificate against this CA (PEM)."""
    cert_file: Path | None = None
    """A client certificate (PEM) to present (etcd's ``--client-cert-auth``); with its key
    in ``key_file``. Turns TLS on too (the store's certificate then checked against the
    system's CAs unless ``ca_file`` is given)."""
    key_file: Path | None = None
    user: str | None = None
    """Authenticate as this etcd user, with the password in ``password_file``."""
    password_file: Path | None = None
    """A file holding the user's password (a trailing newline is not part of it)."""
    reload_check_s: float = 5.0
    """How often, at most, the files are looked at for a change while the store is used
    (:mod:`segtxn.metastore.etcd_credentials`)."""

    @property
    def tls(self) -> bool:
        return self.ca_file is not None or self.cert_file is not None

    @property
    def enabled(self) -> bool:
        return self.tls or self.user is not None

    def check(self) -> None:
        """Raises InvalidArgument: settings that do not go together."""
        if (self.cert_file is None) != (self.key_file is None):
            raise InvalidArgument("a store client certificate needs its key, and the reverse")
        if (self.user is None) != (self.password_file is None):
            raise InvalidArgument("a store user needs a password file, and the reverse")
        if self.user is not None and (not self.user or self.user != self.user.strip()):
            raise InvalidArgument(f"store user {self.user!r}: a name without surrounding spaces")

    def password(self) -> str:
        """The user's password, read from ``password_file``.

        Raises:
            InvalidArgument: no password file, or it cannot be read or is empty.
        """
        if self.password_file is None:
            raise InvalidArgument("no store password file")
        try:
            password = self.password_file.read_text("utf-8").rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidArgument(f"{self.password_file}: cannot be read: {e}") from e
        if not password:
            raise InvalidArgument(f"{self.password_file}: empty")
        return password

    def pem(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """The CA, the client key and the client certificate chain, as bytes.

        Raises:
            InvalidArgument: a file that cannot be read or is not PEM.
        """
        out: list[bytes | None] = []
        for path in (self.ca_file, self.key_file, self.cert_file):
            if path is None:
                out.append(None)
                continue
            try:
                data = path.read_bytes()
            except OSError as e:
                raise InvalidArgument(f"{path}: cannot be read: {e.strerror or e}") from e
            if b"-----BEGIN " not in data:
                raise InvalidArgument(f"{path}: not a PEM file")
            out.append(data)
        return out[0], out[1], out[2]


@dataclass(frozen=True)
class StoreSettings:
    """Limits and tuning of one store client."""

    max_value_bytes: int = 1024 * 1024
    """A record value larger than this is refused with ``TooLarge`` (etcd's request limit
    is 1.5 MiB, and an indexed record's value is also copied into each index entry)."""
    request_timeout_s: float = 5.0
    cache_entries: int = 65_536
    """Records whose index entries the store remembers (:mod:`segtxn.metastore.cache`)."""
    max_attempts: int = 64
    """Retries of an unconditional write that keeps losing races before StoreUnavailable."""
    watch_retry_max_s: float = 2.0
    """Longest pause between attempts to re-establish a broken watch."""
    credentials: StoreCredentials = field(default_factory=StoreCredentials)
    """TLS and a user for the store connection (none by default)."""
