"""The error boundary (segtxn/boundary.py) on a real aiohttp server: what each kind of failure
becomes on the wire and in the log."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from segtxn.boundary import install
from segtxn.broker.http import json_errors
from segtxn.inputs import read_json
from segtxn.metastore import BadVersion, SessionExpired, StoreUnavailable
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.web import AppServer, Listener

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def failing(error: BaseException) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        raise error

    return handler


async def echo_json(request: web.Request) -> web.StreamResponse:
    return web.json_response(await read_json(request))


@pytest.fixture
async def server() -> AsyncIterator[str]:
    app = web.Application(client_max_size=1000)
    install(app)
    app.router.add_get("/bug", failing(RuntimeError("a bug with a secret in it")))
    app.router.add_get("/store-down", failing(StoreUnavailable("etcd is away")))
    app.router.add_get("/session-expired", failing(SessionExpired("session 0x1 has expired")))
    # a broker's JSON handlers translate store errors themselves (a soak run's split got
    # MetadataError for a session that expired while etcd restarted: not retried)
    app.router.add_get(
        "/admin-session-expired", json_errors(failing(SessionExpired("session 0x1 has expired")))
    )
    app.router.add_get("/admin-store-down", json_errors(failing(StoreUnavailable("away"))))
    app.router.add_get("/admin-store-refused", json_errors(failing(BadVersion("/x", 1, 2))))
    app.router.add_get("/store-refused", failing(BadVersion("/x", 1, 2)))
    app.router.add_get("/peer-down", failing(aiohttp.ClientConnectionError("refused")))
    app.router.add_get("/timeout", failing(TimeoutError()))
    app.router.add_get("/long", failing(ServerError(ErrorName.INVALID_ARGUMENT, "\ud800" * 5000)))
    app.router.add_get(
        "/moved", failing(ServerError(ErrorName.NOT_OWNER, "elsewhere", redirect="http://b:1"))
    )
    app.router.add_post("/json", echo_json)
    listener = Listener("127.0.0.1")  # its port, held from the pick on
    port = listener.port
    running = AppServer(app, f"http://127.0.0.1:{port}", None, None, listener=listener)
    await running.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await running.stop()


async def get(url: str, method: str = "GET", **kwargs: object) -> tuple[int, dict[str, str], str]:
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, url, allow_redirects=False, **kwargs) as r,  # type: ignore[arg-type]
    ):
        return r.status, dict(r.headers), await r.text()


async def test_a_bug_is_a_500_with_an_incident_id_and_the_traceback_only_in_the_log(
    server: str, caplog: pytest.LogCaptureFixture
) -> None:
    status, headers, text = await get(f"{server}/bug")
    assert status == 500 and headers["X-Segtxn-Error"] == ErrorName.UNKNOWN
    incident = re.search(r"incident ([0-9a-f]{12})", text)
    assert incident, text
    assert "secret" not in text and "Traceback" not in text and "RuntimeError" not in text
    logged = [r for r in caplog.records if incident.group(1) in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelno == logging.ERROR and logged[0].exc_info


@pytest.mark.parametrize(
    ("path", "status", "name"),
    [
        ("/store-down", 503, ErrorName.SERVICE_NOT_READY),
        ("/session-expired", 503, ErrorName.SERVICE_NOT_READY),
        ("/admin-session-expired", 503, ErrorName.SERVICE_NOT_READY),
        ("/admin-store-down", 503, ErrorName.SERVICE_NOT_READY),
        ("/admin-store-refused", 500, ErrorName.METADATA),
        ("/peer-down", 503, ErrorName.SERVICE_NOT_READY),
        ("/timeout", 503, ErrorName.SERVICE_NOT_READY),
        ("/store-refused", 500, ErrorName.METADATA),
        ("/long", 400, ErrorName.INVALID_ARGUMENT),
        ("/moved", 307, ErrorName.NOT_OWNER),
        ("/nowhere", 404, ErrorName.INVALID_ARGUMENT),
    ],
)
async def test_each_failure_has_its_name_and_status(
    server: str, path: str, status: int, name: ErrorName
) -> None:
    got, headers, text = await get(f"{server}{path}")
    assert (got, headers["X-Segtxn-Error"]) == (status, name), text
    assert len(text) < 7000 and len(headers["X-Segtxn-Message"]) < 8000  # cut, and quotable
    if name is ErrorName.NOT_OWNER:
        assert headers["Location"] == f"http://b:1{path}"


@pytest.mark.parametrize(
    ("body", "status", "name"),
    [
        (b'{"a": [1, {"b": "c"}]}', 200, None),
        (b"[" * 32 + b"]" * 32, 200, None),
        (b"[" * 33 + b"]" * 33, 400, ErrorName.INVALID_ARGUMENT),
        (b'["\\ud800"]', 400, ErrorName.INVALID_ARGUMENT),
        (b'{"\\udc00": 1}', 400, ErrorName.INVALID_ARGUMENT),
        (b"not json", 400, ErrorName.INVALID_ARGUMENT),
        (b"[" * 990 + b"]" * 990, 413, ErrorName.MESSAGE_TOO_LARGE),  # over client_max_size
    ],
)
async def test_json_bodies_are_bounded(
    server: str, body: bytes, status: int, name: ErrorName | None
) -> None:
    got, headers, text = await get(f"{server}/json", "POST", data=body)
    assert got == status, text
    assert headers.get("X-Segtxn-Error") == name


# ------------------------------------------------------------- after a WebSocket upgrade


def failing_after_upgrade(error: BaseException) -> Handler:
    """A WebSocket handler that upgrades, says hello, then fails."""

    async def handler(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_bytes(b"hello")
        raise error

    return handler


@pytest.fixture
async def ws_server() -> AsyncIterator[str]:
    app = web.Application()
    install(app)
    app.router.add_get("/bug", failing_after_upgrade(RuntimeError("a bug with a secret in it")))
    app.router.add_get("/store-down", failing_after_upgrade(StoreUnavailable("etcd is away")))
    app.router.add_get(
        "/refused", failing_after_upgrade(ServerError(ErrorName.NOT_ALLOWED, "x" * 500))
    )
    app.router.add_get("/http-error", failing_after_upgrade(web.HTTPNotFound()))
    listener = Listener("127.0.0.1")  # its port, held from the pick on
    port = listener.port
    running = AppServer(app, f"http://127.0.0.1:{port}", None, None, listener=listener)
    await running.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await running.stop()


async def closed_with(url: str) -> tuple[int | None, str]:
    """Connect, read the hello, then the close frame: its code and reason. Anything else
    (an HTTP response written onto the upgraded connection reads as a broken frame) fails."""
    async with aiohttp.ClientSession() as http, http.ws_connect(url) as ws:
        hello = await ws.receive(timeout=10)
        assert (hello.type, hello.data) == (aiohttp.WSMsgType.BINARY, b"hello")
        closing = await ws.receive(timeout=10)
        assert closing.type is aiohttp.WSMsgType.CLOSE, (closing.type, closing.data)
        return ws.close_code, closing.extra or ""


async def test_a_bug_after_the_upgrade_closes_the_websocket_with_1011_and_an_incident_id(
    ws_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Once upgraded, the connection speaks WebSocket: the failure is a close frame with a
    reason (never an HTTP response written onto it), and the traceback is logged once."""
    code, reason = await closed_with(f"{ws_server}/bug")
    assert code == aiohttp.WSCloseCode.INTERNAL_ERROR, reason
    incident = re.search(r"incident ([0-9a-f]{12})", reason)
    assert incident, reason
    assert "secret" not in reason and len(reason.encode()) <= 123
    logged = [r for r in caplog.records if r.exc_info]
    assert len(logged) == 1 and incident.group(1) in logged[0].getMessage()
    assert logged[0].levelno == logging.ERROR


@pytest.mark.parametrize(
    ("path", "code", "name"),
    [
        ("/store-down", aiohttp.WSCloseCode.TRY_AGAIN_LATER, ErrorName.SERVICE_NOT_READY),
        ("/refused", aiohttp.WSCloseCode.POLICY_VIOLATION, ErrorName.NOT_ALLOWED),
        ("/http-error", aiohttp.WSCloseCode.POLICY_VIOLATION, ErrorName.INVALID_ARGUMENT),
    ],
)
async def test_a_known_failure_after_the_upgrade_closes_with_its_name(
    ws_server: str, caplog: pytest.LogCaptureFixture, path: str, code: int, name: ErrorName
) -> None:
    got, reason = await closed_with(f"{ws_server}{path}")
    assert got == code, reason
    assert reason.startswith(f"{name.value}: "), reason
    assert len(reason.encode()) <= 123  # a close frame's reason: 125 bytes with the code
    assert not [r for r in caplog.records if r.exc_info]  # not a bug: no traceback
