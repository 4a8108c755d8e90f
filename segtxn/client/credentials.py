"""The client's token: what the application gave (a token, a file, a supplier), or what the
environment says, as a :class:`~segtxn.protocol.tokens.TokenSource` that every request and
WebSocket upgrade asks (docs/security.md, "Token refresh in the client").

A source that cannot give a token (its file unreadable or empty, its supplier returning
something that is not a token, or raising) makes the request fail with
:class:`~segtxn.protocol.errors.Unauthenticated`, as a server's refusal of a bad token
would: not retriable, so producers, consumers and calls hand it to the application instead
of retrying until their time limit.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from segtxn.protocol.errors import ErrorName, ServerError, server_error
from segtxn.protocol.tokens import TokenSource, TokenSupplier, TokenUnavailable, token_source

TOKEN_ENV = "SEGTXN_TOKEN"
"""Where :class:`~segtxn.client.Client` finds its token when it is given none."""
TOKEN_FILE_ENV = "SEGTXN_TOKEN_FILE"
"""Else, a file holding it (re-read when it changes)."""

Token = str | Path | TokenSupplier | TokenSource
"""What ``Client(token=...)`` takes: a token, a file holding one, a callable (plain or
async) returning one, or a :class:`~segtxn.protocol.tokens.TokenSource`."""


class _Guarded(TokenSource):
    """``source``, its failures as Unauthenticated."""

    def __init__(self, source: TokenSource) -> None:
        self.source = source

    async def get(self) -> str:
        try:
            return await self.source.get()
        except asyncio.CancelledError:
            raise
        except TokenUnavailable as e:
            raise _no_token(str(e)) from e
        except Exception as e:  # the application's supplier failed
            raise _no_token(f"the token supplier failed: {e!r}") from e


def _no_token(why: str) -> ServerError:
    return server_error(ErrorName.UNAUTHENTICATED, f"the client has no token to send: {why}")


def client_token(token: Token | None) -> TokenSource | None:
    """The source of a client's token: ``token``, else ``$SEGTXN_TOKEN``, else the file
    ``$SEGTXN_TOKEN_FILE``; None: no token.

    Raises:
        ValueError: a token string that is not one line of printable characters.
    """
    if token is None:
        token = os.environ.get(TOKEN_ENV) or None
    if token is None:
        path = os.environ.get(TOKEN_FILE_ENV)
        token = Path(path) if path else None
    return None if token is None else _Guarded(token_source(token))
