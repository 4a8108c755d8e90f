"""How a caller presents its credentials: ``Authorization: Bearer <token>`` on every request
and WebSocket upgrade (docs/security.md). Shared by the client and by servers calling each
other as the cluster role, so that both send the header the same way."""

from __future__ import annotations

from aiohttp import (
    ClientHandlerType,
    ClientMiddlewareType,
    ClientRequest,
    ClientResponse,
    hdrs,
)

BEARER = "Bearer"


def bearer_middleware(token: str) -> ClientMiddlewareType:
    """An aiohttp client middleware that puts ``Authorization: Bearer token`` on every request
    of a session, WebSocket upgrades included, and on each hop of a redirect (aiohttp drops
    the header when a redirect leaves the origin: a ``NotOwner`` 307 leads to another broker
    of the same cluster, which needs it too). A request that already carries the header keeps
    it (a server relaying its caller's request sends the caller's credentials, not its own).

    Raises:
        ValueError: an empty token, or one with characters a header cannot hold.
    """
    token = token.strip()
    if not token or any(c.isspace() or not c.isprintable() for c in token):
        raise ValueError("a token is one line of printable characters without spaces")
    value = f"{BEARER} {token}"

    async def middleware(request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        if hdrs.AUTHORIZATION not in request.headers:
            request.headers[hdrs.AUTHORIZATION] = value
        return await handler(request)

    return middleware
