"""Verifying the signed tokens (JWT) callers present, and the role each one names.

A token is a JWT whose ``sub`` claim is the caller's *role* and whose ``exp`` claim bounds
its life; both are required. It is signed either with a shared secret (HS256: the secret is
a file the server reads) or with a private key whose public half the server holds (RS256 for
an RSA key, ES256/ES384/ES512 for an EC key on P-256/P-384/P-521). The server accepts only
the one algorithm its key is for, so a token cannot choose a weaker check (the ``alg``
confusion of HS256 signed with a public key, or ``none``).

Every refusal is a :class:`~segtxn.protocol.errors.ServerError` named ``Unauthenticated``
whose message says which of these it was: no token, not a bearer token, malformed, expired,
not yet valid, a bad signature (signed with another key), a missing claim. A bad key file
is an :class:`AuthConfigError` at start-up, never a refusal per request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from segtxn.protocol.auth import BEARER
from segtxn.protocol.errors import ErrorName, ServerError

MIN_SECRET_BYTES = 32
"""An HS256 secret shorter than this is refused (RFC 7518, 3.2: at least the hash size)."""

MAX_VERIFIED = 4096
"""Verified tokens a server remembers (about 4 MB at most); past that it forgets them all."""

LEEWAY_S = 5.0
"""Clock skew tolerated on ``exp`` and ``nbf`` between the token's issuer and the server."""

_EC_ALGORITHMS = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}


class AuthConfigError(ValueError):
    """A key, policy or token file that cannot be used (unreadable, malformed, too weak);
    raised at start-up, and it names the file."""


@dataclass(frozen=True)
class Principal:
    """Who a request comes from: the role its token named (``sub``), and whether the policy
    makes that role a superuser (every action, every transaction)."""

    role: str
    superuser: bool = False
    expires_s: float | None = None
    """When its token expires (epoch seconds, the ``exp`` claim)."""


def _unauthenticated(message: str) -> ServerError:
    return ServerError(ErrorName.UNAUTHENTICATED, message)


@dataclass(frozen=True)
class TokenVerifier:
    """Checks tokens against one key: ``algorithm`` and the key it verifies with (the HS256
    secret's bytes, or a public key object). Build it with :meth:`from_secret_file` or
    :meth:`from_public_key_file`."""

    algorithm: str
    key: bytes | rsa.RSAPublicKey | ec.EllipticCurvePublicKey
    source: str
    """The file the key came from (for messages)."""
    _verified: dict[str, tuple[str, float]] = field(default_factory=dict, compare=False, repr=False)
    """Tokens already verified: their role and expiry (see :meth:`role`)."""

    @classmethod
    def from_secret_file(cls, path: Path) -> TokenVerifier:
        """HS256 with the secret in ``path`` (its bytes, without a trailing newline).

        Raises:
            AuthConfigError: unreadable, or shorter than :data:`MIN_SECRET_BYTES`.
        """
        secret = _read(path).rstrip(b"\r\n")
        if len(secret) < MIN_SECRET_BYTES:
            raise AuthConfigError(
                f"{path}: an HS256 secret must be at least {MIN_SECRET_BYTES} bytes, "
                f"not {len(secret)}"
            )
        return cls("HS256", secret, str(path))

    @classmethod
    def from_public_key_file(cls, path: Path) -> TokenVerifier:
        """RS256 (an RSA key) or ES256/384/512 (an EC key) with the PEM public key in ``path``.

        Raises:
            AuthConfigError: unreadable, not a PEM public key, or a key of another kind.
        """
        try:
            key = load_pem_public_key(_read(path))
        except ValueError as e:
            raise AuthConfigError(f"{path}: not a PEM public key ({e})") from e
        if isinstance(key, rsa.RSAPublicKey):
            if key.key_size < 2048:
                raise AuthConfigError(f"{path}: an RSA key of {key.key_size} bits; at least 2048")
            return cls("RS256", key, str(path))
        if isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name in _EC_ALGORITHMS:
            return cls(_EC_ALGORITHMS[key.curve.name], key, str(path))
        raise AuthConfigError(
            f"{path}: a {type(key).__name__}; expected an RSA key or an EC key on P-256, "
            "P-384 or P-521"
        )

    def role(self, token: str) -> str:
        """The role ``token`` names (:meth:`claims` without the expiry)."""
        return self.claims(token)[0]

    def claims(self, token: str) -> tuple[str, float]:
        """The role ``token`` names and when it expires (epoch seconds), if it is signed
        with this key and not expired.

        A token's signature is checked once: up to :data:`MAX_VERIFIED` verified tokens are
        remembered with their expiry (a client sends the same token on every call; an RS256
        or ES256 check costs a hundred microseconds or more), and checked again only for
        that expiry.

        Raises:
            ServerError(Unauthenticated): with what is wrong with it.
        """
        known = self._verified.get(token)
        if known is not None:
            if time.time() <= known[1] + LEEWAY_S:
                return known
            del self._verified[token]  # expired: the full check says so
        verified = self._verify(token)
        if len(self._verified) >= MAX_VERIFIED:
            self._verified.clear()
        self._verified[token] = verified
        return verified

    def _verify(self, token: str) -> tuple[str, float]:
        if not token.isascii():  # (bytes a header carried that are not text: no JWT)
            raise _unauthenticated("the token is not a valid JWT: it is not ASCII")
        try:
            claims = jwt.decode(
                token,
                self.key,
                algorithms=[self.algorithm],
                options={"require": ["exp", "sub"]},
                leeway=LEEWAY_S,
            )
        except jwt.ExpiredSignatureError:
            raise _unauthenticated(_expired(token)) from None
        except jwt.ImmatureSignatureError as e:  # its nbf, or its iat: PyJWT says which
            claim = "iat" if "(iat)" in str(e) else "nbf"
            raise _unauthenticated(
                f"the token is not valid yet (its {claim} is in the future)"
            ) from None
        except jwt.InvalidSignatureError:
            raise _unauthenticated(
                "the token's signature does not verify: it was signed with another key"
            ) from None
        except jwt.InvalidAlgorithmError:
            raise _unauthenticated(
                f"the token is not signed with {self.algorithm}, the only algorithm "
                "this server accepts"
            ) from None
        except jwt.MissingRequiredClaimError as e:
            raise _unauthenticated(f"the token has no {e.claim!r} claim") from None
        except jwt.InvalidTokenError as e:
            raise _unauthenticated(f"the token is not a valid JWT: {e}") from None
        role = claims["sub"]
        if not isinstance(role, str) or not role:
            raise _unauthenticated("the token's 'sub' claim (its role) must be a non-empty string")
        try:  # PyJWT takes any integer: one of 400 digits is no time
            expires_s = float(claims["exp"])
        except OverflowError:
            raise _unauthenticated("the token's 'exp' claim is beyond any time") from None
        return role, expires_s


def _expired(token: str) -> str:
    """'the token expired at <UTC time>' when its ``exp`` can be read, else without the time."""
    try:
        exp: Any = jwt.decode(token, options={"verify_signature": False}).get("exp")
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(exp)))
    except (jwt.InvalidTokenError, TypeError, ValueError, OverflowError):
        return "the token has expired"
    return f"the token expired at {when}"


def bearer_token(header: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header.

    Raises:
        ServerError(Unauthenticated): no header, or not a bearer token.
    """
    if header is None:
        raise _unauthenticated(
            "no credentials: send 'Authorization: Bearer <token>' (the client's token= "
            "option, SEGTXN_TOKEN, or the CLI's --token)"
        )
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != BEARER.lower() or not token.strip():
        raise _unauthenticated("the Authorization header is not 'Bearer <token>'")
    return token.strip()


def read_token_file(path: Path) -> str:
    """A token kept in a file (the cluster role's, mounted from a Secret): its one line.

    Raises:
        AuthConfigError: unreadable or empty.
    """
    token = _read(path).decode("ascii", "replace").strip()
    if not token or any(c.isspace() for c in token):
        raise AuthConfigError(f"{path}: expected one token on one line")
    return token


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise AuthConfigError(f"{path}: cannot be read: {e.strerror or e}") from e
