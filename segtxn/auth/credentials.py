"""The files a server's token checks come from, and reloading them without a restart.

With tokens on, a server reads three files: the key tokens are verified with (an HS256
secret or a public key), the policy, and the cluster role's token (what it presents to
other servers). :meth:`CredentialFiles.load` reads and checks them together into one
:class:`Credentials`: the cluster token must verify with the key and name one of the
policy's superusers, or servers could not call each other.

:class:`LiveCredentials` holds the credentials in force and watches the files as the TLS
certificate is watched (:mod:`segtxn.auth.tls`): every ``reload_check_s`` it compares their
modification times, sizes and inodes (a Kubernetes Secret update swaps a symlink: new
inodes) and, when one changed, loads all three again. A set that loads replaces the old one
at once: new requests are checked with the new key and policy, open WebSockets with the
new policy on their next frame (:func:`segtxn.auth.guard.recheck`), the cluster role's
calls carry the new cluster token. A set that does not load (a policy with a typo, a key
that no longer verifies the cluster token, a file half-written) is refused with one
WARNING line saying why, and the old credentials stay until the files change again.

Reading and checking happens on the event loop: three small files, only when they
changed; a server's handlers never see a half-swapped set.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from segtxn.auth.policy import Policy
from segtxn.auth.tokens import AuthConfigError, TokenVerifier, read_token_file
from segtxn.protocol.errors import ServerError
from segtxn.protocol.tokens import TokenSource

log = logging.getLogger(__name__)

RELOAD_CHECK_S = 5.0
"""How often a server looks for a new key, policy or cluster token."""


@dataclass(frozen=True)
class Credentials:
    """What a server's security files say at one moment (checked together)."""

    verifier: TokenVerifier
    policy: Policy
    cluster_token: str
    """The token this server presents when it calls another server."""


@dataclass(frozen=True)
class CredentialFiles:
    """Where the credentials are read from: one of the two key files, the policy, the
    cluster token."""

    policy_file: Path
    cluster_token_file: Path
    secret_file: Path | None = None
    public_key_file: Path | None = None

    @property
    def paths(self) -> tuple[Path, ...]:
        key = self.secret_file or self.public_key_file
        return tuple(p for p in (key, self.policy_file, self.cluster_token_file) if p)

    def load(self) -> Credentials:
        """Read and check the three files (module docstring).

        Raises:
            AuthConfigError: a file unreadable or wrong, or a cluster token that does not
                verify with the key or does not name a superuser; it says which.
        """
        key_file = self.secret_file or self.public_key_file
        if key_file is None or (self.secret_file and self.public_key_file):
            raise AuthConfigError("give an HS256 secret or a public key, not both")
        verifier = (
            TokenVerifier.from_secret_file(key_file)
            if self.secret_file is not None
            else TokenVerifier.from_public_key_file(key_file)
        )
        policy = Policy.load(self.policy_file)
        token = read_token_file(self.cluster_token_file)
        try:
            role = verifier.role(token)
        except ServerError as e:
            raise AuthConfigError(f"{self.cluster_token_file}: {e.message}") from e
        if role not in policy.superusers:
            raise AuthConfigError(
                f"{self.cluster_token_file}: its role {role!r} must be one of the policy's "
                "superusers (servers act for every client)"
            )
        return Credentials(verifier, policy, token)

    def stamp(self) -> tuple[tuple[int, int, int] | None, ...]:
        """What changes when a file is rewritten or replaced (None: cannot be stat'ed)."""
        return tuple(_stat(p) for p in self.paths)


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class LiveCredentials:
    """The credentials in force and the watch that reloads their files (module
    docstring). Loaded once when made (raises AuthConfigError as :meth:`CredentialFiles.load`).
    """

    def __init__(self, files: CredentialFiles, reload_check_s: float = RELOAD_CHECK_S) -> None:
        self.files = files
        self.reload_check_s = reload_check_s
        self._seen = files.stamp()
        self.current = files.load()
        self._refused: tuple[tuple[int, int, int] | None, ...] | None = None
        self.reloads = 0
        """How many times new files were loaded (tests and logs)."""
        self.refusals = 0
        """How many changed sets were refused (tests)."""

    def check(self) -> bool:
        """Load the files again if they changed since the last load; whether it did. A set
        that does not load is logged once and refused until the files change again."""
        stamp = self.files.stamp()
        if stamp in (self._seen, self._refused):
            return False
        try:
            loaded = self.files.load()
        except AuthConfigError as e:
            self._refused = stamp
            self.refusals += 1
            log.warning("auth: refused the new security files, keeping the current ones: %s", e)
            return False
        self.current, self._seen, self._refused = loaded, stamp, None
        self.reloads += 1
        log.info("auth: loaded new security files: %s", ", ".join(map(str, self.files.paths)))
        return True

    def cluster_token(self) -> TokenSource:
        """The cluster role's token in force, for the servers' own calls."""
        return _ClusterToken(self)

    async def reloading(self, app: web.Application) -> AsyncIterator[None]:
        """For an application's ``cleanup_ctx``: checks the files every
        ``reload_check_s`` while it runs. Two applications sharing one set of credentials
        (``segtxn standalone``) may both watch it: a check after another's finds nothing
        new."""

        async def watch() -> None:
            while True:
                await asyncio.sleep(self.reload_check_s)
                self.check()

        task = asyncio.create_task(watch(), name="auth-reload")
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


class _ClusterToken(TokenSource):
    def __init__(self, live: LiveCredentials) -> None:
        self._live = live

    async def get(self) -> str:
        return self._live.current.cluster_token
