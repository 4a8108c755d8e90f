"""A server's connection limits (segtxn/connlimits.py), on a real aiohttp server of segtxn's
(:class:`~segtxn.web.AppServer`) and real sockets: connections past a limit are answered
with the JSON error before their request is read and closed; a connection that sends no
whole request is closed once idle; the slots of closed ones are given back."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest
import uvloop
from aiohttp import web

from segtxn import connlimits
from segtxn import web as web_module
from segtxn.connlimits import PROBE_HEADROOM, ConnectionGate, ConnectionLimits
from segtxn.web import AppServer, Listener
from tests.waiting import wait_until

ANSWERED_S = 5.0


async def hello(request: web.Request) -> web.Response:
    return web.json_response({"hello": True})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"healthy": True})


@contextlib.asynccontextmanager
async def serving(limits: ConnectionLimits) -> AsyncIterator[AppServer]:
    app = web.Application()
    app.router.add_get("/hello", hello)
    app.router.add_get("/healthz", healthz)
    listener = Listener("127.0.0.1", 0)
    server = AppServer(
        app, f"http://127.0.0.1:{listener.port}", None, None, listener=listener,
        connections=limits,
    )  # fmt: skip
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def opened(server: AppServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", server.port)


async def answer_of(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], dict[str, str]]:
    """(status, headers, JSON body) of the response on ``reader``, read to its close."""
    raw = await asyncio.wait_for(reader.read(), ANSWERED_S)
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    return int(status_line.split()[1]), headers, json.loads(body)


async def get_hello(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    writer.write(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    return await asyncio.wait_for(reader.readuntil(b"}"), ANSWERED_S)


async def test_a_connection_past_the_limit_and_its_headroom_is_refused_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=connlimits.__name__)
    async with serving(ConnectionLimits(max_connections=2)) as server:
        admitted = 2 + PROBE_HEADROOM
        held = [await opened(server) for _ in range(admitted)]  # (they send nothing: held)
        reader, writer = await opened(server)
        status, headers, body = await answer_of(reader)  # (answered without a request)
        writer.close()
        assert status == 503
        assert body["error"] == headers["X-Segtxn-Error"] == "ServiceNotReady"
        assert f"{admitted} connections" in body["message"]
        assert "--max-connections 2" in body["message"]
        assert headers["Retry-After"] == "1" and headers["Connection"] == "close"
        assert any("refused 1 connection" in r.getMessage() for r in caplog.records)
        assert server.gate.refusals == {"server": 1} and server.gate.open == admitted
        assert b'"hello"' in await get_hello(*held[0])  # those under the limit are served
        for _, writer in held:
            writer.close()
        async with aiohttp.ClientSession() as http:  # their slots come back

            async def served() -> bool:
                async with http.get(f"http://127.0.0.1:{server.port}/hello") as response:
                    return response.status == 200

            await wait_until(served, timeout=ANSWERED_S, what="a slot given back")


async def test_past_the_limit_a_connection_serves_health_checks_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The kubelet's probes go through the same limit: a server at it must not fail its
    liveness probe (and be restarted) for the flood it refuses."""
    caplog.set_level(logging.WARNING, logger=connlimits.__name__)
    async with serving(ConnectionLimits(max_connections=1)) as server:
        _, first = await opened(server)
        reader, writer = await opened(server)  # in the headroom
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b'"healthy"' in await asyncio.wait_for(reader.readuntil(b"}"), ANSWERED_S)
        writer.write(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")  # no probe: refused, closed
        status, headers, body = await answer_of(reader)
        writer.close()
        assert (status, body["error"], headers["X-Segtxn-Error"]) == (
            503, "ServiceNotReady", "ServiceNotReady"
        )  # fmt: skip
        assert "--max-connections 1" in body["message"]
        assert server.gate.refusals == {"server": 1}
        first.close()


async def test_a_connection_in_the_probes_headroom_is_soon_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A flood's idle connections must not hold the headroom (and the probes out of it)
    for the whole idle timeout."""
    monkeypatch.setattr(web_module, "PROBE_CONNECTION_S", 0.3)
    async with serving(ConnectionLimits(max_connections=1)) as server:
        first_reader, first = await opened(server)
        reader, writer = await opened(server)  # in the headroom, sending nothing
        assert await asyncio.wait_for(reader.read(), ANSWERED_S) == b""  # closed by it
        writer.close()
        await wait_until(lambda: server.gate.open == 1, timeout=ANSWERED_S, what="released")
        assert b'"hello"' in await get_hello(first_reader, first)  # the first one stays
        first.close()


async def test_one_address_past_its_limit_is_told_too_many_requests() -> None:
    async with serving(ConnectionLimits(max_connections=10, max_per_ip=1)) as server:
        _, first = await opened(server)
        reader, writer = await opened(server)
        writer.write(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")  # (sent: read and dropped)
        status, headers, body = await answer_of(reader)
        writer.close()
        assert (status, body["error"], headers["X-Segtxn-Error"]) == (
            429, "TooManyRequests", "TooManyRequests"
        )  # fmt: skip
        assert "127.0.0.1" in body["message"] and "--max-connections-per-ip" in body["message"]
        assert server.gate.refusals == {"address": 1}
        first.close()


async def test_a_websocket_client_refused_gets_the_typed_error() -> None:
    """A client reads a failed handshake's headers only: the error is there too (here on a
    connection in the headroom past the limit, whose request is no probe)."""
    async with serving(ConnectionLimits(max_connections=1)) as server:
        _, held = await opened(server)
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(f"http://127.0.0.1:{server.port}/hello")
        assert refused.value.status == 503
        assert refused.value.headers is not None
        assert refused.value.headers["X-Segtxn-Error"] == "ServiceNotReady"
        held.close()


async def test_a_connection_that_sends_no_whole_request_is_closed_once_idle() -> None:
    """Half a request line, then nothing: it held its descriptor for aiohttp's hour."""
    async with serving(ConnectionLimits(idle_timeout_s=0.3)) as server:
        reader, writer = await opened(server)
        writer.write(b"GET /hel")
        assert await asyncio.wait_for(reader.read(), ANSWERED_S) == b""  # closed by it
        writer.close()
        reader, writer = await opened(server)  # one that answers in time is served
        assert b'"hello"' in await get_hello(reader, writer)
        writer.close()


def test_the_limits_refuse_what_makes_no_sense() -> None:
    for bad in (
        {"max_connections": 0},
        {"max_per_ip": -1},
        {"idle_timeout_s": 0.0},
        {"idle_timeout_s": float("nan")},
    ):
        with pytest.raises(ValueError):
            ConnectionLimits(**bad)


def test_by_default_half_the_open_files_limit_is_for_connections() -> None:
    gate = ConnectionGate(ConnectionLimits(), "test")
    assert gate.max_connections == max(1, connlimits.open_files_limit() // 2)


async def status_of_hello(server: AppServer) -> int:
    """The status a new connection to ``server`` gets for GET /hello (503: refused)."""
    reader, writer = await opened(server)
    try:
        writer.write(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), ANSWERED_S)
        return int(line.split()[1])
    finally:
        writer.close()


async def test_servers_of_one_process_share_the_default_half_of_the_open_files(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A standalone (a broker and a coordinator in one process), both on the default: each
    took half the open-files limit, so together their connections could take every
    descriptor, none left for the ledgers' files. The half is the process's, shared."""
    monkeypatch.setattr(connlimits, "open_files_limit", lambda: 8)
    async with serving(ConnectionLimits()) as broker, serving(ConnectionLimits()) as other:
        held = [await opened(broker) for _ in range(4)]
        try:
            for connection in held:  # all four admitted (answered), and still open
                assert b'"hello"' in await get_hello(*connection)
            assert await status_of_hello(other) == 503  # the process's half is taken
        finally:
            for _, writer in held:
                writer.close()


def test_a_connection_past_the_limit_is_refused_on_uvloop_too() -> None:
    """uvloop, the servers' default loop (segtxn/cli/loops.py), whose transports are not
    ``asyncio.Transport`` instances: the refusal's ``assert isinstance`` failed in
    ``connection_made``, the connection got no answer and stayed open, uncounted, for as
    long as its client kept it: the flood the limit is for."""

    async def refused() -> int:
        async with serving(ConnectionLimits(max_connections=1)) as server:
            held = [(await opened(server))[1] for _ in range(1 + PROBE_HEADROOM)]
            reader, writer = await opened(server)
            try:
                status, _, _ = await answer_of(reader)  # (read to its close)
                return status
            finally:
                writer.close()
                for one in held:
                    one.close()

    assert uvloop.run(refused()) == 503
