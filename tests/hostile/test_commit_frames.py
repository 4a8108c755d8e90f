"""Commit frames on a producer connection are bounded like its sends: at most
:data:`~segtxn.broker.producer_endpoint.MAX_PENDING_COMMITS` are being decided at once;
one beyond is refused ``TooManyRequests`` at once, naming its ``request_id``, with nothing
decided (a client ends that transaction at its coordinator), and the connection goes on.
Before, each frame started a task of its own with no limit (a client could pile up as
many as it could write)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import msgspec
import pytest

from segtxn.broker import producer_endpoint, txncommit
from segtxn.client import Client
from segtxn.protocol import frames
from segtxn.protocol.errors import ErrorName
from segtxn.protocol.frames import Error, ProducerReady, Receipt, Send
from tests.cluster import Cluster
from tests.waiting import wait_until
from tests.wsframes import next_frame

TOPIC = "persistent://acme/hostile/t"
PATH = "persistent/acme/hostile/t"


def _commit(request_id: int) -> bytes:
    txn = [2**48, 1]  # no such transaction: each is decided TransactionNotFound
    frame = {"type": "commit", "request_id": request_id, "txn": txn, "ops": 1, "digest": 0}
    return msgspec.msgpack.encode(frame)


async def test_a_commit_beyond_the_bound_is_too_many_requests_and_the_rest_go_on(
    cluster: Cluster,
    client: Client,
    http: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(producer_endpoint, "MAX_PENDING_COMMITS", 2)
    gate = asyncio.Event()
    deciding: list[int] = []
    decide = txncommit._answer

    async def held(*args: Any) -> Any:
        deciding.append(args[2].request_id)
        await gate.wait()
        return await decide(*args)

    monkeypatch.setattr(txncommit, "_answer", held)
    await client.admin.create_topic(TOPIC)
    async with http.ws_connect(f"{cluster.url}/ws/v2/producer/{PATH}?name=many") as ws:
        try:
            await _exchange(ws, gate, deciding)
        finally:
            gate.set()  # (a failed run leaves no commit waiting)


async def _exchange(
    ws: aiohttp.ClientWebSocketResponse, gate: asyncio.Event, deciding: list[int]
) -> None:
    """Three commits where two may be decided at once (held at ``gate``), then a send."""
    assert isinstance(await next_frame(ws), ProducerReady)
    for request_id in (1, 2, 3):
        await ws.send_bytes(_commit(request_id))
    await ws.send_bytes(frames.encode(Send(seq=0, payload=b"after")))
    refused = await next_frame(ws)  # while 1 and 2 are being decided
    assert isinstance(refused, Error), refused
    assert (refused.error, refused.request_id) == (ErrorName.TOO_MANY_REQUESTS.value, 3)
    assert "2 commits" in refused.message, refused.message
    assert isinstance(await next_frame(ws), Receipt)  # the connection goes on
    await wait_until(lambda: deciding == [1, 2], what="commits 1 and 2 being decided")
    gate.set()
    answers = [await next_frame(ws), await next_frame(ws)]
    assert {(a.error, a.request_id) for a in answers if isinstance(a, Error)} == {
        (ErrorName.TRANSACTION_NOT_FOUND.value, 1),
        (ErrorName.TRANSACTION_NOT_FOUND.value, 2),
    }, answers
    await ws.send_bytes(_commit(4))  # room again
    again = await next_frame(ws)
    assert isinstance(again, Error) and again.request_id == 4, again
    assert again.error == ErrorName.TRANSACTION_NOT_FOUND.value, again
