"""The resend of a send the broker refused is refused again, never answered as stored.

A producer's send can be refused while its later sends are stored: a send in a transaction
that ended meanwhile (its coordinator aborted it, at its timeout say) is refused
``TransactionConflict``, and the plain send after it is stored. When the connection is lost
with the answers, the producer sends both again. The refused one's seq is then below the
highest stored, and de-duplication answered it as "a duplicate, where unknown" (``[-1, -1]``,
Pulsar's rule): the application was told its message was stored when it never was.

Real components: a broker and a v5 coordinator in process (tests/cluster.py), the real
client, or raw WebSocket frames; the answers are lost by an outbox that swallows them and
then hangs up, as a network cut right after the broker answered does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import WSCloseCode

from segtxn.broker import producer_endpoint
from segtxn.broker.outbox import Outbox
from segtxn.client import Client, MessageId
from segtxn.protocol import frames
from segtxn.protocol.errors import ErrorName, TransactionConflict
from segtxn.protocol.frames import Error, ProducerReady, Receipt, Send, SendBatch
from segtxn.protocol.names import TopicName
from segtxn.protocol.txn import TxnAction, TxnId, TxnState
from tests.cluster import Cluster
from tests.waiting import wait_until
from tests.wsframes import next_frame

TOPIC = "topic://acme/refused/orders"
SEGMENT = TopicName.parse("segment://acme/refused/orders/0")


class LostAnswers:
    """Swallow the answers (receipts, errors) to ``seqs`` on the connection of producer
    ``name``, then hang up on it: the answers are lost with their connection."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str, seqs: set[int]) -> None:
        self.lost: list[frames.Frame] = []
        self.cut = asyncio.Event()
        test = self

        class Cutting(Outbox):
            def send(self, frame: frames.Frame) -> None:
                seq = getattr(frame, "seq", None)
                if self._name != f"producer-{name}" or seq not in seqs or test.cut.is_set():
                    super().send(frame)
                    return
                test.lost.append(frame)
                if len(test.lost) == len(seqs):
                    test.cut.set()
                    test.closing = asyncio.ensure_future(self.ws.close(code=WSCloseCode.GOING_AWAY))

        self.closing: asyncio.Future[bool] | None = None
        """The hang-up (held, so that it is not collected)."""
        monkeypatch.setattr(producer_endpoint, "Outbox", Cutting)


async def abort(cluster: Cluster, wire_id: tuple[int, int]) -> None:
    """The coordinator ends the transaction behind its client's back (as at its timeout),
    and the broker has seen it end (else a send may be written first, and refused only as
    it is recorded: then it is in the ledger, an orphan, which is another case)."""
    txn = TxnId(*wire_id)
    await cluster.coordinator.coordinator.end_txn(txn, TxnAction.ABORT)
    headers = cluster.broker.service.headers
    await wait_until(
        lambda: (header := headers.cached(txn)) is None or header.state is not TxnState.OPEN,
        what="the broker sees the transaction ended",
    )


async def test_a_send_refused_as_its_transaction_ended_is_not_taken_as_stored_after_a_reconnect(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC, name="p")
    txn = await client.transaction().start()
    await producer.send(b"in time", txn=txn)  # seq 0: the segment joins the transaction
    await abort(cluster, txn.wire_id)
    lost = LostAnswers(monkeypatch, "p-s0", {1, 2})
    await producer.close()  # its next connection gets the cutting outbox
    producer = await client.create_producer(TOPIC, name="p")
    late = await producer.send_async(b"too late", txn=txn)  # seq 1: refused
    plain = await producer.send_async(b"plain")  # seq 2: stored
    async with asyncio.timeout(10):
        await lost.cut.wait()
    refused, stored = sorted(lost.lost, key=lambda f: getattr(f, "seq", 0))
    assert isinstance(refused, Error) and refused.error == ErrorName.TRANSACTION_CONFLICT, refused
    assert isinstance(stored, Receipt) and not stored.duplicate, stored
    # the producer reconnects and sends both again
    assert await asyncio.wait_for(plain, 10) == MessageId(str(SEGMENT), *stored.message_id)
    try:
        answered = await asyncio.wait_for(late, 10)
    except TransactionConflict as e:  # the refusal it got, given again
        assert e.message == refused.message, (e, refused)
    else:
        pytest.fail(f"the refused send was answered as stored, at {answered}")
    reader = await client.subscribe(TOPIC, "r", initial_position="earliest")
    assert (await reader.receive(timeout_s=10)).value == b"plain"


@asynccontextmanager
async def raw_producer(
    cluster: Cluster, name: str
) -> AsyncIterator[tuple[aiohttp.ClientWebSocketResponse, ProducerReady]]:
    url = f"{cluster.url}/ws/v2/producer/{SEGMENT.path}?name={name}"
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        ready = await next_frame(ws)
        assert isinstance(ready, ProducerReady), ready
        yield ws, ready


async def answers(ws: aiohttp.ClientWebSocketResponse, count: int) -> dict[int, frames.Frame]:
    got: dict[int, frames.Frame] = {}
    for _ in range(count):
        frame = await next_frame(ws)
        assert isinstance(frame, Receipt | Error) and frame.seq is not None, frame
        got[frame.seq] = frame
    return got


@pytest.mark.parametrize("reload", [False, True], ids=["loaded", "reloaded"])
async def test_the_resend_of_a_refused_send_below_a_stored_one_is_refused(
    client: Client, cluster: Cluster, reload: bool
) -> None:
    """Raw frames: the answers are never read; the resend comes on a new connection, to
    the topic still loaded (the refusal is remembered) or loaded again (the replay shows
    that seq was never stored: the producer's later entries are replayed, it is not
    among them)."""
    await client.admin.create_topic(TOPIC, segments=1)
    txn = await client.transaction().start()
    async with raw_producer(cluster, "p") as (ws, _):
        await ws.send_bytes(frames.encode(Send(seq=0, payload=b"in", txn=txn.wire_id)))
        assert isinstance((await answers(ws, 1))[0], Receipt)
        await abort(cluster, txn.wire_id)
        batch = [Send(seq=1, payload=b"late", txn=txn.wire_id), Send(seq=2, payload=b"plain")]
        await ws.send_bytes(frames.encode(SendBatch(sends=batch)))
        state = cluster.broker.service.topics[SEGMENT].dedup.state("p")
        await wait_until(lambda: state.last == 2 and not state.in_flight, what="2 stored")
    if reload:
        await cluster.broker.service.unload(SEGMENT)
    async with raw_producer(cluster, "p") as (ws, ready):
        assert ready.last_sequence_id == 2
        await ws.send_bytes(frames.encode(SendBatch(sends=batch)))
        again = await answers(ws, 2)
    assert isinstance(again[2], Receipt) and again[2].duplicate, again
    refused = again[1]
    assert isinstance(refused, Error), f"the refused send was answered as stored: {refused}"
    assert refused.error == ErrorName.TRANSACTION_CONFLICT, refused
    said = "no more writes" if not reload else "p/1 was not stored (refused, or never received)"
    assert said in refused.message, refused
