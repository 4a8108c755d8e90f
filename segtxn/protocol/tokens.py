"""Where a caller's token comes from, so that a long-lived client outlives any one token.

A token is fixed, kept in a file, or supplied by the application:

- :class:`FixedToken`: one token for the client's life (when it expires, the server
  refuses it and the application gets ``Unauthenticated``);
- :class:`TokenFile`: a file holding one token on one line (a Kubernetes projected
  service-account token, a Secret a sidecar rewrites); it is re-read when its modification
  time, size or inode changes, so a rewritten file is used from the next request on;
- :class:`SuppliedToken`: a callable (plain or async) the client calls for a token, again
  whenever the one it has expires within ``refresh_before_s`` (read from the token's
  ``exp`` claim, without verifying it: the server verifies).

Every request and WebSocket upgrade asks its source (:func:`segtxn.protocol.auth.
bearer_middleware`), so a reconnect after the server closed a connection for an expired
token presents a fresh one. Asking costs a file ``stat`` (a file) or a clock read (a
supplier) between refreshes.
"""

from __future__ import annotations

import abc
import asyncio
import base64
import inspect
import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

TokenSupplier = Callable[[], str] | Callable[[], Awaitable[str]]
"""An application's callable that returns a current token (plain or async)."""

REFRESH_BEFORE_S = 30.0
"""A supplied token is replaced when it expires within this many seconds."""


class TokenUnavailable(ValueError):
    """A token source cannot give a token: its file cannot be read or holds no token, or
    the supplier returned something that is not one. Not retriable by the client: the
    application (or whoever writes the file) must fix it."""


def check_token(token: object, source: str) -> str:
    """``token`` stripped, if it is one line of printable characters without spaces.

    Raises:
        TokenUnavailable: naming ``source``.
    """
    if not isinstance(token, str):
        raise TokenUnavailable(f"{source}: a token is a string, not {type(token).__name__}")
    token = token.strip()
    if not token or any(c.isspace() or not c.isprintable() for c in token):
        raise TokenUnavailable(
            f"{source}: a token is one line of printable characters without spaces"
        )
    return token


def expiry_of(token: str) -> float | None:
    """The ``exp`` claim of a JWT (epoch seconds), read without verifying it; None when
    ``token`` is not a JWT with a numeric ``exp`` a float holds (one of 400 digits is no
    time: the server refuses it, with its reason)."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except ValueError:  # bad base64, bad UTF-8 or bad JSON
        return None
    exp = payload.get("exp") if isinstance(payload, dict) else None
    if not isinstance(exp, int | float) or isinstance(exp, bool):
        return None
    try:
        return float(exp)
    except OverflowError:
        return None


class TokenSource(abc.ABC):
    """Gives the token to present now."""

    @abc.abstractmethod
    async def get(self) -> str:
        """The current token.

        Raises:
            TokenUnavailable: there is none to give.
        """


class FixedToken(TokenSource):
    def __init__(self, token: str) -> None:
        try:
            self._token = check_token(token, "token")
        except TokenUnavailable as e:
            raise ValueError(str(e)) from None

    async def get(self) -> str:
        return self._token


class TokenFile(TokenSource):
    """A file with one token on one line, re-read when it changes. A file that cannot be
    read (mid-rewrite) or holds no token keeps the last good token in use; with none yet,
    :meth:`get` raises."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._token: str | None = None
        self.reads = 0
        """How many times the file was read (tests)."""

    async def get(self) -> str:
        problem: Exception | None = None
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp != self._stamp:
                self.reads += 1
                self._token = check_token(self.path.read_text("ascii"), str(self.path))
                self._stamp = stamp
        except (OSError, UnicodeDecodeError, TokenUnavailable) as e:
            problem = e  # the last good token, if any, stays in use
        if self._token is None:
            raise TokenUnavailable(f"{self.path}: no token: {problem}") from problem
        return self._token


class SuppliedToken(TokenSource):
    """A supplier called for a token when there is none, or when the last one expires
    within ``refresh_before_s``; concurrent requests wait for one call. A token without a
    readable ``exp`` is asked for again on every request."""

    def __init__(self, supplier: TokenSupplier, refresh_before_s: float = REFRESH_BEFORE_S) -> None:
        self._supplier = supplier
        self._refresh_before_s = refresh_before_s
        self._token: str | None = None
        self._expires_s: float | None = None
        self._lock = asyncio.Lock()
        self.calls = 0
        """How many times the supplier was called (tests)."""

    def _fresh(self) -> str | None:
        if self._token is None or self._expires_s is None:
            return None
        return self._token if time.time() < self._expires_s - self._refresh_before_s else None

    async def get(self) -> str:
        token = self._fresh()
        if token is not None:
            return token
        async with self._lock:
            token = self._fresh()
            if token is not None:
                return token
            self.calls += 1
            value = self._supplier()
            if inspect.isawaitable(value):
                value = await value
            token = check_token(value, "the token supplier")
            self._token, self._expires_s = token, expiry_of(token)
            return token


def token_source(token: str | Path | TokenSupplier | TokenSource) -> TokenSource:
    """The source for what a caller was given: a token string (fixed), a :class:`Path`
    (a file), a callable (a supplier), or a source.

    Raises:
        ValueError: a fixed token that is not one line of printable characters.
    """
    if isinstance(token, TokenSource):
        return token
    if isinstance(token, str):
        return FixedToken(token)
    if isinstance(token, Path):
        return TokenFile(token)
    return SuppliedToken(token)
