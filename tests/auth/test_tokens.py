"""Tokens, keys and policies on their own: what verifies, what is refused and how it is said,
and which security files a server refuses to start with."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path

import jwt
import pytest

from segtxn.auth import Action, AuthConfigError, AuthSettings, Policy, Principal, TokenVerifier
from segtxn.auth.tokens import bearer_token
from segtxn.protocol.errors import ErrorName, ServerError
from tests.auth.conftest import (
    CLUSTER,
    OTHER_SECRET,
    POLICY,
    PRODUCER,
    SECRET,
    ec_pair,
    rsa_pair,
    token,
    write_policy,
)


def _refusal(verifier: TokenVerifier, value: str) -> str:
    with pytest.raises(ServerError) as caught:
        verifier.role(value)
    assert caught.value.name is ErrorName.UNAUTHENTICATED
    assert caught.value.name.http_status == 401
    return caught.value.message


def _hs256(tmp_path: Path) -> TokenVerifier:
    (tmp_path / "secret").write_bytes(SECRET + b"\n")
    return TokenVerifier.from_secret_file(tmp_path / "secret")


def test_hs256_names_the_role_and_refuses_each_bad_token_with_its_reason(tmp_path: Path) -> None:
    verifier = _hs256(tmp_path)
    assert verifier.role(token(PRODUCER)) == PRODUCER
    assert "expired at" in _refusal(verifier, token(PRODUCER, ttl_s=-3600))
    assert "signed with another key" in _refusal(verifier, token(PRODUCER, key=OTHER_SECRET))
    assert "not a valid JWT" in _refusal(verifier, "not-a-token")
    no_exp = jwt.encode({"sub": PRODUCER}, SECRET, algorithm="HS256")
    assert "'exp'" in _refusal(verifier, no_exp)
    no_sub = jwt.encode({"exp": int(time.time()) + 60}, SECRET, algorithm="HS256")
    assert "'sub'" in _refusal(verifier, no_sub)
    not_yet = jwt.encode(
        {"sub": PRODUCER, "exp": int(time.time()) + 600, "nbf": int(time.time()) + 300},
        SECRET,
        algorithm="HS256",
    )
    assert "not valid yet" in _refusal(verifier, not_yet)
    claims = {"sub": PRODUCER, "exp": int(time.time()) + 60}
    unsigned = jwt.encode(claims, None, algorithm="none")  # type: ignore[arg-type]  # "none": no key
    assert "HS256" in _refusal(verifier, unsigned)


@pytest.mark.parametrize("make", [rsa_pair, ec_pair], ids=["RS256", "ES256"])
def test_public_keys_verify_their_own_tokens_only(tmp_path: Path, make: object) -> None:
    pair = make()  # type: ignore[operator]
    (tmp_path / "key.pem").write_bytes(pair.public_pem)
    verifier = TokenVerifier.from_public_key_file(tmp_path / "key.pem")
    good = token(PRODUCER, key=pair.private, algorithm=verifier.algorithm)
    assert verifier.role(good) == PRODUCER
    stranger = make()  # type: ignore[operator]
    forged = token(PRODUCER, key=stranger.private, algorithm=verifier.algorithm)
    assert "signed with another key" in _refusal(verifier, forged)
    expired = token(PRODUCER, key=pair.private, algorithm=verifier.algorithm, ttl_s=-600)
    assert "expired" in _refusal(verifier, expired)
    # the classic confusion: an HS256 token whose "secret" is the public key itself
    assert verifier.algorithm in _refusal(verifier, _hs256_signed_with(pair.public_pem))


def _b64(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def _hs256_signed_with(secret: bytes) -> str:
    """An HS256 JWT made by hand (PyJWT refuses a PEM key as an HMAC secret)."""
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = _b64(json.dumps({"sub": PRODUCER, "exp": int(time.time()) + 60}).encode())
    signing_input = header + b"." + claims
    signature = hmac.new(secret, signing_input, hashlib.sha256).digest()
    return (signing_input + b"." + _b64(signature)).decode()


def test_bearer_header_shapes() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    for bad in (None, "Basic dXNlcjpwYXNz", "Bearer", "Bearer  "):
        with pytest.raises(ServerError) as caught:
            bearer_token(bad)
        assert caught.value.name is ErrorName.UNAUTHENTICATED


def test_key_files_that_cannot_be_used_are_refused_at_start_up(tmp_path: Path) -> None:
    (tmp_path / "short").write_bytes(b"too short")
    with pytest.raises(AuthConfigError, match="at least 32 bytes"):
        TokenVerifier.from_secret_file(tmp_path / "short")
    with pytest.raises(AuthConfigError, match="cannot be read"):
        TokenVerifier.from_secret_file(tmp_path / "missing")
    (tmp_path / "garbage.pem").write_bytes(b"-----BEGIN PUBLIC KEY-----\nnope\n")
    with pytest.raises(AuthConfigError, match="not a PEM public key"):
        TokenVerifier.from_public_key_file(tmp_path / "garbage.pem")


def test_policy_grants_by_tenant_namespace_and_star() -> None:
    policy = Policy.parse(POLICY)
    producer = policy.principal(PRODUCER)
    assert policy.allows(producer, frozenset({Action.PRODUCE}), ("acme", "orders"))
    assert not policy.allows(producer, frozenset({Action.PRODUCE}), ("acme", "billing"))
    assert not policy.allows(producer, frozenset({Action.CONSUME}), ("acme", "orders"))
    consumer = policy.principal("orders-consumer")
    assert policy.allows(consumer, frozenset({Action.CONSUME}), ("acme", "billing"))
    assert not policy.allows(consumer, frozenset({Action.CONSUME}), ("acme2", "billing"))
    assert not policy.allows(consumer, frozenset({Action.CONSUME}), None)
    ops = policy.principal("ops")
    assert policy.allows(ops, frozenset({Action.ADMIN}), None)
    assert policy.principal(CLUSTER).superuser
    nobody = Principal("nobody")
    assert not policy.allows(nobody, frozenset(Action), ("acme", "orders"))


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ([], "expected a mapping"),
        ({"roles": {}, "extra": 1}, "unknown keys"),
        ({"roles": {"r": [{"resource": "acme", "actions": ["produce"]}]}}, "resource 'acme'"),
        ({"roles": {"r": [{"resource": "*/x", "actions": ["produce"]}]}}, "resource"),
        ({"roles": {"r": [{"resource": "a/b", "actions": ["write"]}]}}, "each one of"),
        ({"roles": {"r": [{"resource": "a/b", "actions": []}]}}, "non-empty list"),
        ({"roles": {"r": [{"resource": "a/b"}]}}, "expected {resource"),
        ({"superusers": "root"}, "list of role names"),
    ],
)
def test_a_policy_that_cannot_mean_anything_is_refused(data: object, problem: str) -> None:
    with pytest.raises(AuthConfigError, match=problem):
        Policy.parse(data, "p.yaml")


def test_server_settings_need_a_whole_setup(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(SECRET)
    policy = write_policy(tmp_path / "policy.yaml")
    (tmp_path / "cluster").write_text(token(CLUSTER))
    (tmp_path / "not-super").write_text(token(PRODUCER))
    (tmp_path / "expired").write_text(token(CLUSTER, ttl_s=-600))
    (tmp_path / "key.pem").write_bytes(rsa_pair().public_pem)
    assert not AuthSettings.from_files().enabled
    with pytest.raises(AuthConfigError, match="without a token key"):
        AuthSettings.from_files(policy_file=policy)
    with pytest.raises(AuthConfigError, match="not both"):
        AuthSettings.from_files(
            secret_file=tmp_path / "secret", public_key_file=tmp_path / "key.pem"
        )
    with pytest.raises(AuthConfigError, match="policy file"):
        AuthSettings.from_files(
            secret_file=tmp_path / "secret", cluster_token_file=tmp_path / "cluster"
        )
    with pytest.raises(AuthConfigError, match="cluster role's token"):
        AuthSettings.from_files(secret_file=tmp_path / "secret", policy_file=policy)
    with pytest.raises(AuthConfigError, match="must be one of the policy's superusers"):
        AuthSettings.from_files(
            secret_file=tmp_path / "secret",
            policy_file=policy,
            cluster_token_file=tmp_path / "not-super",
        )
    with pytest.raises(AuthConfigError, match="expired"):
        AuthSettings.from_files(
            secret_file=tmp_path / "secret",
            policy_file=policy,
            cluster_token_file=tmp_path / "expired",
        )
    on = AuthSettings.from_files(
        secret_file=tmp_path / "secret",
        policy_file=policy,
        cluster_token_file=tmp_path / "cluster",
    )
    assert on.enabled and on.cluster_token and not on.tls.enabled


def test_a_verified_token_is_checked_again_only_for_its_expiry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    verifier = _hs256(tmp_path)
    decoded: list[str] = []
    real_decode = jwt.decode

    def counting(value: str, *args: object, **kwargs: object) -> object:
        decoded.append(value)
        return real_decode(value, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("segtxn.auth.tokens.jwt.decode", counting)
    value = token(PRODUCER, ttl_s=60)
    assert [verifier.role(value) for _ in range(3)] == [PRODUCER] * 3
    assert len(decoded) == 1  # the signature was checked once
    later = time.time() + 3600
    monkeypatch.setattr("segtxn.auth.tokens.time.time", lambda: later)
    assert verifier.role(value) == PRODUCER  # PyJWT's clock is the real one: still valid
    assert len(decoded) == 2  # past its expiry by the cache's clock: checked in full again
