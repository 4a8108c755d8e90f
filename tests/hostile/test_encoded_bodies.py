"""A body the client says is compressed (``Content-Encoding: gzip`` or ``deflate``) and
that does not decompress is the client's mistake: 400 InvalidArgument with what aiohttp
said of it, on the broker and on the coordinator, nothing stored, nothing logged at ERROR
(it was a 500 with an incident, and aiohttp logged "Unhandled exception" twice more as it
drained the rest of the body after the answer)."""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import logging
import zlib

import aiohttp
import pytest

from segtxn.client import Client
from segtxn.protocol.errors import ErrorName
from segtxn.protocol.limits import MAX_REQUEST_BYTES
from tests.cluster import Cluster
from tests.hostile.conftest import refusal

TOPIC = "persistent://acme/hostile/t"


async def _exchange(url: str, *parts: bytes) -> tuple[int, dict[str, str]]:
    """Send ``parts`` as they are, one write each; the answer's status and JSON body, read
    until the server closes the connection (in 10 s)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        for part in parts:
            writer.write(part)
            await writer.drain()
        async with asyncio.timeout(10):
            answer = await reader.read()  # (the server closes the connection)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_a_body_that_does_not_decompress_is_invalid_argument(
    cluster: Cluster, client: Client, encoding: str
) -> None:
    await client.admin.create_topic(TOPIC)
    coordinator = cluster.coordinator.settings.advertise_url
    body = b'{"garbage": "not compressed"}'
    for url, method, path in [
        (cluster.url, "PUT", "/admin/v2/persistent/acme/hostile/t/properties"),
        (coordinator, "POST", "/txn/v2/1000000000000:1/partitions"),
    ]:
        request = (
            f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Encoding: {encoding}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        status, answer = await _exchange(url, request)
        assert (status, answer["error"]) == (400, ErrorName.INVALID_ARGUMENT.value), answer
        assert encoding in answer["message"]
    assert "garbage" not in await client.admin.properties(TOPIC)
    await client.admin.update_properties(TOPIC, {"after": "yes"})  # still serving


@pytest.mark.parametrize(
    "encoding",
    ["br", "zstd", "compress", "x-garbage", "gzip, br", "identity, gzip", "compress, gzip"],
)
async def test_a_body_in_an_encoding_the_server_does_not_decode_is_415(
    cluster: Cluster, client: Client, encoding: str
) -> None:
    """A body whose ``Content-Encoding`` the server does not decode was read as if it were
    not encoded: stored as the raw bytes, or refused as "not JSON". It is refused 415,
    naming the encoding, before anything is done."""
    await client.admin.create_topic(TOPIC)
    coordinator = cluster.coordinator.settings.advertise_url
    body = b'{"garbage": "encoded?"}'
    for url, method, path in [
        (cluster.url, "PUT", "/admin/v2/persistent/acme/hostile/t/properties"),
        (coordinator, "POST", "/txn/v2/1000000000000:1/partitions"),
    ]:
        request = (
            f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Encoding: {encoding}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode() + body
        status, answer = await _exchange(url, request)
        assert (status, answer["error"]) == (415, ErrorName.INVALID_ARGUMENT.value), answer
        assert answer["message"] == (
            f"Content-Encoding {encoding!r} is not one this server decodes: send the body "
            "as it is, or in gzip or deflate"
        )
    assert "garbage" not in await client.admin.properties(TOPIC)
    await client.admin.update_properties(TOPIC, {"after": "yes"})  # still serving


@pytest.mark.parametrize("encoding", ["x-gzip", "X-Gzip"])
async def test_a_body_in_x_gzip_is_415_telling_to_send_it_as_gzip(
    cluster: Cluster, client: Client, http: aiohttp.ClientSession, encoding: str
) -> None:
    """RFC 9110 (8.4.1.3) says a recipient SHOULD take ``x-gzip`` for ``gzip``, but aiohttp
    decodes only ``gzip``, ``deflate``, ``br`` and ``zstd`` (both its parsers) and reads an
    ``x-gzip`` body as the bytes that came. It stays refused, and the answer tells the
    client what to send instead: the same bytes, labelled ``gzip``."""
    await client.admin.create_topic(TOPIC)
    body = gzip.compress(b'{"encoded": "x-gzip"}')
    url = f"{cluster.url}/admin/v2/persistent/acme/hostile/t/properties"
    headers = {"Content-Encoding": encoding, "Content-Type": "application/json"}
    status, name, message = await refusal(http, "PUT", url, data=body, headers=headers)
    assert (status, name) == (415, ErrorName.INVALID_ARGUMENT.value)
    assert message == (
        f"Content-Encoding {encoding!r} is not one this server decodes: x-gzip is gzip's "
        "old name; send the same body with Content-Encoding: gzip"
    )
    assert "encoded" not in await client.admin.properties(TOPIC)
    headers["Content-Encoding"] = "gzip"
    async with http.put(url, data=body, headers=headers) as response:
        assert response.status == 204, await response.text()
    assert (await client.admin.properties(TOPIC))["encoded"] == "x-gzip"


@pytest.mark.parametrize("encoding", ["identity", "IDENTITY", "gzip", "deflate"])
async def test_a_body_as_it_is_or_in_gzip_or_deflate_is_read(
    client: Client, cluster: Cluster, http: aiohttp.ClientSession, encoding: str
) -> None:
    await client.admin.create_topic(TOPIC)
    body = json.dumps({"encoded": encoding}).encode()
    if encoding.lower() != "identity":
        compressor = zlib.compressobj(wbits=31 if encoding == "gzip" else 15)
        body = compressor.compress(body) + compressor.flush()
    url = f"{cluster.url}/admin/v2/persistent/acme/hostile/t/properties"
    headers = {"Content-Encoding": encoding, "Content-Type": "application/json"}
    async with http.put(url, data=body, headers=headers) as response:
        assert response.status == 204, await response.text()
    assert (await client.admin.properties(TOPIC))["encoded"] == encoding


@pytest.mark.parametrize("close", [True, False])
@pytest.mark.parametrize("encodings", [("gzip", "compress"), ("compress", "gzip")])
async def test_a_body_with_two_content_encoding_headers_is_415(
    cluster: Cluster,
    client: Client,
    caplog: pytest.LogCaptureFixture,
    encodings: tuple[str, str],
    close: bool,
) -> None:
    """Two ``Content-Encoding`` lines are one list of two encodings (RFC 9110), which the
    server does not decode. aiohttp's C parser decodes by the last line and the check read
    the first: ``gzip`` then ``compress`` passed the check and the body was taken as it came
    (stored as the raw bytes). Whatever the order, it is refused 415, nothing stored.

    With ``gzip`` last, aiohttp decodes the body as gzip: after the 415 it read the unread
    body itself, failed to decompress it and logged "Unhandled exception" with a traceback.
    Nothing is logged at ERROR; the answer closes the connection, whether or not the client
    asked (the parser cannot go on past a body it failed to decode)."""
    await client.admin.create_topic(TOPIC)
    coordinator = cluster.coordinator.settings.advertise_url
    body = b'{"garbage": "encoded?"}'
    lines = "".join(f"Content-Encoding: {e}\r\n" for e in encodings)
    connection = "Connection: close\r\n" if close else ""
    for url, method, path in [
        (cluster.url, "PUT", "/admin/v2/persistent/acme/hostile/t/properties"),
        (coordinator, "POST", "/txn/v2/1000000000000:1/partitions"),
    ]:
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: x\r\n{lines}"
            f"Content-Length: {len(body)}\r\n{connection}\r\n"
        ).encode()
        status, answer = await _exchange(url, head, body)
        assert (status, answer["error"]) == (415, ErrorName.INVALID_ARGUMENT.value), answer
        assert f"Content-Encoding {', '.join(encodings)!r}" in answer["message"]
    assert "garbage" not in await client.admin.properties(TOPIC)
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [f"{r.name}: {r.getMessage()}" for r in bad]


def _put_then_read(url: str, path: str, body: bytes, encoding: str) -> int:
    """As ``http.client``, ``urllib`` and ``requests`` send: the whole body, then the answer."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("PUT", path, body=body, headers={"Content-Encoding": encoding})
        return conn.getresponse().status
    finally:
        conn.close()


@pytest.mark.parametrize("encoding", ["x-gzip", "compress"])
async def test_a_client_that_sends_a_large_body_before_reading_gets_its_415(
    cluster: Cluster, client: Client, encoding: str
) -> None:
    """A connection closed while such a client still sends its body (left unread) resets
    it: its write fails (BrokenPipe, ECONNRESET) and it never reads the answer."""
    await client.admin.create_topic(TOPIC)
    body = b"x" * MAX_REQUEST_BYTES
    path = "/admin/v2/persistent/acme/hostile/t/properties"
    for attempt in range(10):
        status = await asyncio.to_thread(_put_then_read, cluster.url, path, body, encoding)
        assert status == 415, attempt
