"""The replica wire (``POST /replica/v1/...``, segtxn/ledger/replicas/wire.py) refusing a
peer's bad body as its documented ``InvalidArgument``: one in a ``Content-Encoding`` the
node does not decode (415), and one that stops coming (400, the connection closed).

Real ``ReplicaNode`` behind a real aiohttp server (tests/ledger/replicas.py); requests
written by hand on a socket, as a broken or hostile peer would send them.
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from segtxn import inputs
from segtxn.ledger.replicas.wire import encode_frames
from tests.ledger.replicas import Cluster, NodeServer, started

LEDGER = "persistent://t/n/wire"


async def open_to(server: NodeServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = server.url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


def append_head(server: NodeServer, length: int, *extra: str) -> bytes:
    path = (
        f"/replica/v1/append?instance={server.node.instance}&ledger=persistent%3A%2F%2Ft%2Fn"
        f"%2Fwire&id=1&first=0"
    )
    headers = "".join(f"{h}\r\n" for h in extra)
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n{headers}\r\n"
    ).encode()


async def answer_of(reader: asyncio.StreamReader) -> tuple[int, dict[str, object]]:
    """The status and JSON body of the answer, read until the server closes."""
    async with asyncio.timeout(10):
        data = await reader.read()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


@pytest.mark.parametrize("encoding", ["compress", "x-garbage", "gzip, br"])
async def test_an_append_in_an_encoding_the_node_does_not_decode_is_refused(
    cluster: Cluster, encoding: str
) -> None:
    """Read as it came, the encoded bytes were taken for frames: stored as entries, or
    refused as cut frames, which names the wrong fault."""
    (server,) = (await started(cluster, 1)).servers
    server.node.create(LEDGER, 1)
    body = encode_frames([b"entry"])
    reader, writer = await open_to(server)
    try:
        writer.write(
            append_head(server, len(body), f"Content-Encoding: {encoding}", "Connection: close")
            + body
        )
        status, answer = await answer_of(reader)
    finally:
        writer.close()
    assert (status, answer["error"]) == (415, "InvalidArgument"), answer
    assert f"Content-Encoding {encoding!r}" in str(answer["message"])
    assert server.node.stat(LEDGER, 1)[0] == 0  # nothing appended


@pytest.mark.parametrize("close", [True, False])
async def test_an_append_under_two_encoding_lines_is_refused_without_a_traceback(
    cluster: Cluster, caplog: pytest.LogCaptureFixture, close: bool
) -> None:
    """``compress`` then ``gzip`` on two lines: aiohttp's parser decodes the body as gzip
    (by the last line), the node refuses it 415 unread, and aiohttp then read the rest of
    the body itself, failed to decompress it and logged "Unhandled exception" with a
    traceback: a peer's mistake in the node's log as a bug. The answer closes the
    connection (the parser cannot go on past a body it failed to decode)."""
    caplog.set_level(logging.INFO)
    (server,) = (await started(cluster, 1)).servers
    server.node.create(LEDGER, 1)
    body = encode_frames([b"entry"])
    lines = ["Content-Encoding: compress", "Content-Encoding: gzip"]
    if close:
        lines.append("Connection: close")
    reader, writer = await open_to(server)
    try:
        writer.write(append_head(server, len(body), *lines))
        await writer.drain()
        writer.write(body)  # (after the head: it may come after the answer)
        status, answer = await answer_of(reader)  # (bounded: 10 s; read until it closes)
    finally:
        writer.close()
    assert (status, answer["error"]) == (415, "InvalidArgument"), answer
    assert "Content-Encoding 'compress, gzip'" in str(answer["message"])
    assert server.node.stat(LEDGER, 1)[0] == 0  # nothing appended
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [f"{r.name}: {r.getMessage()}" for r in bad]


async def test_an_append_whose_body_stops_coming_is_refused_in_time(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer that sends the head and part of the body, then nothing, held the node's
    handler (and the connection) for ever: the wire read the body with no time limit.
    It is refused once :data:`segtxn.inputs.BODY_READ_TIMEOUT_S` passes, and the
    connection closed (what came after could not be told from the body)."""
    monkeypatch.setattr(inputs, "BODY_READ_TIMEOUT_S", 0.5)
    (server,) = (await started(cluster, 1)).servers
    server.node.create(LEDGER, 1)
    body = encode_frames([b"entry"])
    reader, writer = await open_to(server)
    try:
        writer.write(append_head(server, len(body)) + body[:3])
        await writer.drain()
        status, answer = await answer_of(reader)  # (bounded: 10 s)
    finally:
        writer.close()
    assert (status, answer["error"]) == (400, "InvalidArgument"), answer
    assert answer["message"] == (
        f"the body did not arrive in 0.5 s (3 of its {len(body)} bytes came); send all of "
        "it, as its Content-Length says"
    )
    assert server.node.stat(LEDGER, 1)[0] == 0  # nothing appended
