"""Tokens at the edge, with security on (tests/auth/conftest.py's cluster): a token the
server cannot take is 401 ``Unauthenticated`` with what is wrong with it, on the broker and
on the coordinator, never a 500 with a traceback in the log."""

from __future__ import annotations

import time

import aiohttp
import jwt
import pytest
from multidict import CIMultiDict

from segtxn.protocol.errors import ErrorName
from tests.auth.conftest import ROOT, SECRET, STRANGER, SecureCluster, token
from tests.hostile.conftest import refusal

PATHS = {"broker": "/admin/v2/persistent/acme/orders", "coordinator": "/txn/v2/stats"}


def _url(secure: SecureCluster, server: str) -> str:
    return (secure.url if server == "broker" else secure.txn_url) + PATHS[server]


@pytest.mark.parametrize("server", ["broker", "coordinator"])
async def test_a_signed_token_whose_exp_is_beyond_any_time_is_unauthenticated(
    secure: SecureCluster, http: aiohttp.ClientSession, server: str
) -> None:
    """PyJWT takes any integer ``exp``; one of 400 digits does not fit a float."""
    token = jwt.encode({"sub": ROOT, "exp": 10**400}, SECRET, algorithm="HS256")
    headers = {"Authorization": f"Bearer {token}"}
    status, name, message = await refusal(http, "GET", _url(secure, server), headers=headers)
    assert (status, name) == (401, ErrorName.UNAUTHENTICATED.value), message
    assert "exp" in message


@pytest.mark.parametrize("server", ["broker", "coordinator"])
async def test_two_authorization_headers_are_unauthenticated(
    secure: SecureCluster, http: aiohttp.ClientSession, server: str
) -> None:
    """Which of two credentials a server takes is not the client's to guess, nor a proxy's
    in front of it that may check the other one: neither is taken."""
    headers = CIMultiDict[str]()
    headers.add("Authorization", f"Bearer {token(ROOT)}")
    headers.add("Authorization", f"Bearer {token(STRANGER)}")
    status, name, message = await refusal(http, "GET", _url(secure, server), headers=headers)
    assert (status, name) == (401, ErrorName.UNAUTHENTICATED.value), message
    assert "2 Authorization headers" in message


async def test_a_token_issued_in_the_future_is_refused_naming_its_iat(
    secure: SecureCluster, http: aiohttp.ClientSession
) -> None:
    """PyJWT refuses an ``iat`` in the future as it does an ``nbf``: the message named
    ``nbf`` for both, sending the issuer to look for a claim the token did not have."""
    future = int(time.time()) + 3600
    token = jwt.encode({"sub": ROOT, "exp": future + 600, "iat": future}, SECRET, "HS256")
    headers = {"Authorization": f"Bearer {token}"}
    status, name, message = await refusal(http, "GET", _url(secure, "broker"), headers=headers)
    assert (status, name) == (401, ErrorName.UNAUTHENTICATED.value), message
    assert "iat" in message and "nbf" not in message
