"""A client's token supplier handing over a JWT whose ``exp`` no clock can hold: the token
is used (the server is the one to judge it: 401 with its reason) and, having no readable
expiry, asked for again on the next request, as a token without ``exp`` is; the client
does not fail with an OverflowError of its own."""

from __future__ import annotations

import base64
import json

from segtxn.protocol.tokens import SuppliedToken, expiry_of


def _jwt(claims: dict[str, object]) -> str:
    def part(value: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'HS256', 'typ': 'JWT'})}.{part(claims)}.c2ln"


def test_an_exp_beyond_any_time_is_no_readable_expiry() -> None:
    assert expiry_of(_jwt({"sub": "r", "exp": 10**400})) is None
    assert expiry_of(_jwt({"sub": "r", "exp": 1_900_000_000})) == 1_900_000_000.0


async def test_a_supplied_token_with_such_an_exp_is_used_and_asked_for_again() -> None:
    token = _jwt({"sub": "r", "exp": 10**400})
    source = SuppliedToken(lambda: token)
    assert await source.get() == token
    assert await source.get() == token
    assert source.calls == 2
