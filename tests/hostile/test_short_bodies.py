"""A body shorter than its ``Content-Length`` (the client stopped sending, or counted wrong)
does not keep the connection and its handler waiting for ever: once the body has not
arrived in :data:`segtxn.inputs.BODY_READ_TIMEOUT_S`, the answer is 400 InvalidArgument
saying so, the connection closes, and nothing is logged at ERROR (the client's mistake)."""

from __future__ import annotations

import asyncio
import json

import pytest

from segtxn import inputs
from segtxn.client import Client
from segtxn.protocol.errors import ErrorName
from tests.cluster import Cluster

TOPIC = "persistent://acme/hostile/t"


async def test_half_a_body_is_answered_and_the_connection_closed(
    cluster: Cluster, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inputs, "BODY_READ_TIMEOUT_S", 0.3)
    await client.admin.create_topic(TOPIC)
    coordinator = cluster.coordinator.settings.advertise_url
    body = b'{"half": "of a body that is promised whole"}'
    for url, method, path in [
        (cluster.url, "PUT", "/admin/v2/persistent/acme/hostile/t/properties"),
        (coordinator, "POST", "/txn/v2/1000000000000:1/partitions"),
    ]:
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(
                f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body[: len(body) // 2]
            )
            await writer.drain()
            async with asyncio.timeout(10):
                answer = await reader.read()  # to the end: the server closes the connection
        finally:
            writer.close()
        head, _, text = answer.partition(b"\r\n\r\n")
        error = json.loads(text)
        assert (int(head.split(b" ", 2)[1]), error["error"]) == (
            400,
            ErrorName.INVALID_ARGUMENT.value,
        ), error
        assert "did not arrive" in error["message"], error
    assert "half" not in await client.admin.properties(TOPIC)
    await client.admin.update_properties(TOPIC, {"after": "yes"})  # still serving
