"""Frames after the upgrade that a hand-written client may send and the Python client never
does: each gets an answer (a frame that asks for nothing is still answered, with an
``Error``), and the connection goes on."""

from __future__ import annotations

import aiohttp
import msgspec

from segtxn.client import Client
from segtxn.protocol import frames
from segtxn.protocol.errors import ErrorName
from segtxn.protocol.frames import Error, ProducerReady, Receipt, Send
from tests.cluster import Cluster
from tests.wsframes import next_frame

TOPIC = "persistent://acme/hostile/t"
PATH = "persistent/acme/hostile/t"


async def test_an_empty_send_batch_is_answered_invalid_message(
    cluster: Cluster, client: Client, http: aiohttp.ClientSession
) -> None:
    """Before: no answer at all; a client waiting for one waited forever."""
    await client.admin.create_topic(TOPIC)
    async with http.ws_connect(f"{cluster.url}/ws/v2/producer/{PATH}?name=empty") as ws:
        assert isinstance(await next_frame(ws), ProducerReady)
        await ws.send_bytes(msgspec.msgpack.encode({"type": "send_batch", "sends": []}))
        error = await next_frame(ws, 5)
        assert isinstance(error, Error), error
        assert error.error == ErrorName.INVALID_MESSAGE.value
        assert "no sends" in error.message
        await ws.send_bytes(frames.encode(Send(seq=0, payload=b"after")))
        receipt = await next_frame(ws)
        assert isinstance(receipt, Receipt) and receipt.seq == 0


async def test_a_commit_frame_with_a_request_id_out_of_range_is_refused_undecided(
    cluster: Cluster, client: Client, http: aiohttp.ClientSession
) -> None:
    """docs/protocol.md: a ``request_id`` is 0..2^64-1, else InvalidArgument; the commit
    frame's was not checked: one of -1 was decided (here: TransactionNotFound)."""
    await client.admin.create_topic(TOPIC)
    async with http.ws_connect(f"{cluster.url}/ws/v2/producer/{PATH}?name=committer") as ws:
        assert isinstance(await next_frame(ws), ProducerReady)
        commit = {"type": "commit", "request_id": -1, "txn": [2**48, 1], "ops": 1, "digest": 0}
        await ws.send_bytes(msgspec.msgpack.encode(commit))
        error = await next_frame(ws)
        assert isinstance(error, Error), error
        assert (error.error, error.request_id) == (ErrorName.INVALID_ARGUMENT.value, -1), error
        assert "request_id" in error.message
        await ws.send_bytes(frames.encode(Send(seq=0, payload=b"after")))
        assert isinstance(await next_frame(ws), Receipt)
