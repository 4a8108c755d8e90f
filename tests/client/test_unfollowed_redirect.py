"""A 3xx the client's HTTP session does not follow (no ``Location`` to follow) is an
answer it did not get, not a success: before, any status below 400 was taken for one, and
a coordinator answering a participant's ``NotOwner`` (a 307) without an address made an
END_TXN look done while the transaction stayed COMMITTING (found by a helper)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from segtxn.client import Client
from segtxn.client.connection import Connector
from segtxn.client.errors import NotOwner, ServerError

pytestmark = pytest.mark.asyncio


def connector(client: Client) -> Connector:
    """The client's HTTP caller (every admin, lookup and coordinator call goes through it)."""
    assert client._connector is not None  # (open)
    return client._connector


@pytest.fixture
async def redirecting() -> AsyncIterator[str]:
    """A server that answers every request 307 with segtxn's error headers and no Location,
    or a bare 302 with no body on ``/bare``."""

    async def handle(request: web.Request) -> web.Response:
        if request.path.endswith("/bare"):
            return web.Response(status=302)
        return web.json_response(
            {"error": "NotOwner", "message": "served by another broker"},
            status=307,
            headers={"X-Segtxn-Error": "NotOwner", "X-Segtxn-Message": "served%20elsewhere"},
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_a_307_not_followed_is_the_error_it_names(redirecting: str) -> None:
    async with Client(redirecting, operation_timeout_s=5) as client:
        with pytest.raises(NotOwner, match="served elsewhere"):
            await connector(client).request("POST", "/txn/v2/1:2/commit", json={})


async def test_a_bare_3xx_is_an_error_not_an_empty_success(redirecting: str) -> None:
    async with Client(redirecting, operation_timeout_s=5) as client:
        with pytest.raises(ServerError, match="HTTP 302"):
            await connector(client).request("GET", "/bare")
