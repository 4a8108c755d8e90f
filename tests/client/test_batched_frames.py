"""What travels together comes apart in order: the broker's receipt and message batches, and
the client's one timer for many sends' deadlines."""

from __future__ import annotations

import asyncio
import itertools

from hypothesis import given
from hypothesis import strategies as st

from segtxn.broker.outbox import Outbox
from segtxn.client import Client
from segtxn.client.timeouts import Expiries
from segtxn.protocol import frames
from segtxn.protocol.frames import (
    MAX_BATCHED_PAYLOAD,
    AckReceipt,
    Message,
    MessageBatch,
    Receipt,
    ReceiptBatch,
    Rewind,
)
from tests.cluster import Cluster

# ---------------------------------------------------------------------- coalesce / unbatch

_frame = st.one_of(
    st.builds(Receipt, seq=st.integers(0, 2**64 - 1), message_id=st.just((1, 2))),
    st.builds(
        Message,
        message_id=st.tuples(st.integers(0, 9), st.integers(0, 9)),
        payload=st.sampled_from([b"", b"x" * 100, b"y" * (MAX_BATCHED_PAYLOAD // 2 + 1)]),
    ),
    st.builds(Rewind, epoch=st.integers(0, 9)),
    st.builds(AckReceipt, request_id=st.integers(1, 9)),
)


@given(st.lists(_frame, max_size=40))
def test_coalesced_frames_unbatch_to_what_was_queued(queued: list[frames.Frame]) -> None:
    sent = frames.coalesce(queued)
    assert [f for frame in sent for f in frames.unbatch(frame)] == queued  # type: ignore[arg-type]
    for frame in sent:
        if isinstance(frame, ReceiptBatch | MessageBatch):
            inner = frame.receipts if isinstance(frame, ReceiptBatch) else frame.messages
            assert len(inner) >= 2  # a lone receipt or message travels as itself
        if isinstance(frame, MessageBatch):
            assert sum(len(m.payload) for m in frame.messages) <= MAX_BATCHED_PAYLOAD
    # nothing that could have gone together went apart
    for before, after in itertools.pairwise(sent):
        assert not (isinstance(before, Receipt | ReceiptBatch) and isinstance(after, Receipt))


class _Socket:
    """Records what an outbox writes (aiohttp's WebSocketResponse, as far as it is used)."""

    closed = False

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def send_bytes(self, data: bytes) -> None:
        self.sent.append(data)


async def test_an_outbox_sends_what_was_queued_together_as_one_message() -> None:
    socket = _Socket()
    outbox = Outbox(socket, 100, "test")  # type: ignore[arg-type]
    queued: list[frames.Frame] = [Receipt(seq=i, message_id=(1, i)) for i in range(50)]
    queued.append(Rewind(epoch=1))
    queued += [Message(message_id=(1, i), payload=b"p") for i in range(3)]
    for frame in queued:
        outbox.send(frame)  # before start: all of them wait in the queue
    outbox.start()
    await outbox.close()  # flushes the queue
    assert len(socket.sent) == 3  # 50 receipts, the rewind, 3 messages
    decoded = [frames.server_frame.decode(data) for data in socket.sent]
    assert [f for frame in decoded for f in frames.unbatch(frame)] == queued


async def test_receipts_and_messages_reach_the_application_one_by_one(cluster: Cluster) -> None:
    topic = "persistent://acme/batched/events"
    async with Client(cluster.url) as client:
        await client.admin.create_topic(topic)
        producer = await client.create_producer(topic)
        consumer = await client.subscribe(topic, "s", initial_position="earliest")
        sent = await asyncio.gather(
            *[await producer.send_async(f"m{i}".encode()) for i in range(300)]
        )
        assert [m.entry_id for m in sent] == sorted(m.entry_id for m in sent)
        received = [await consumer.receive(10) for _ in range(300)]
        assert [m.value for m in received] == [f"m{i}".encode() for i in range(300)]
        assert [m.message_id for m in received] == sent


# ---------------------------------------------------------------------- Expiries


async def test_expiries_fire_in_deadline_order_under_one_timer() -> None:
    loop = asyncio.get_running_loop()
    fired: list[str] = []
    done = asyncio.Event()

    def expire(key: str) -> None:
        fired.append(key)
        if len(fired) == 3:
            done.set()

    expiries: Expiries[str] = Expiries(expire, lambda _: True)
    now = loop.time()
    expiries.add(now + 0.06, "c")
    expiries.add(now + 0.02, "a")
    expiries.add(now + 0.04, "b")
    async with asyncio.timeout(5):
        await done.wait()
    assert fired == ["a", "b", "c"]
    assert loop.time() >= now + 0.06
    assert len(expiries) == 0


async def test_settled_deadlines_do_not_pile_up() -> None:
    loop = asyncio.get_running_loop()
    live = {"keep"}
    fired: list[str] = []
    done = asyncio.Event()

    def expire(key: str) -> None:
        fired.append(key)
        done.set()

    expiries: Expiries[str] = Expiries(expire, live.__contains__)
    expiries.add(loop.time() + 0.05, "keep")
    for i in range(10_000):  # each settled at once: dropped when the heap grows
        expiries.add(loop.time() + 60, f"settled-{i}")
    assert len(expiries) <= 1 + 1024 + 1
    async with asyncio.timeout(5):
        await done.wait()
    assert fired == ["keep"]
    expiries.clear()
    assert len(expiries) == 0
