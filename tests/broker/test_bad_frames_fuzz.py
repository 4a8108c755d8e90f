"""Random frames after the WebSocket upgrade: Hypothesis throws random bytes, random msgpack
values, almost-right frames and valid ones (as binary or text) at a producer and a consumer
on one broker, and checks each is answered as its decoding says (a receipt, or an ``Error``
frame of its name), both connections stay open, and the broker still serves a new client
afterwards. The hand-written cases are in test_bad_frames.py.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from segtxn.broker.app import BrokerServer
from segtxn.protocol import frames
from segtxn.protocol.errors import ErrorName
from segtxn.protocol.frames import (
    Ack,
    AckReceipt,
    Error,
    Flow,
    Message,
    Nack,
    Receipt,
    Send,
    SendBatch,
)
from tests.broker.bad_input_support import KNOWN_ERRORS, LIMIT, PATH, TOPIC, Stored
from tests.broker.bad_input_support import error_frame as _error
from tests.broker.bad_input_support import ids as _ids
from tests.broker.bad_input_support import next_server_frame as _next
from tests.broker.bad_input_support import open_consumer as _consumer
from tests.broker.bad_input_support import open_producer as _producer
from tests.broker.bad_input_support import pack as _pack
from tests.broker.bad_input_support import still_serves as _still_serves

_INT = st.integers(min_value=-(2**63), max_value=2**64 - 1)
_SCALAR = (
    st.none() | st.booleans() | _INT | st.floats() | st.text(max_size=12) | st.binary(max_size=12)
)
_ANY = st.recursive(
    _SCALAR,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8) | _INT, inner, max_size=4)
    ),
    max_leaves=12,
)
_SMALL = st.integers(min_value=-2, max_value=1200)
_ID = st.tuples(st.integers(-1, 3), st.integers(-1, 4)) | st.tuples(_INT, _INT)


def _or_any(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return strategy | _ANY


_VALID_SEND = st.builds(
    Send,
    seq=_INT,
    payload=st.binary(max_size=LIMIT + 100),
    key=st.none() | st.text(max_size=8),
    properties=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
    event_time_ms=st.none() | _INT,
)
_VALID = st.one_of(
    _VALID_SEND,
    st.builds(SendBatch, sends=st.lists(_VALID_SEND, max_size=4)),
    st.builds(Flow, permits=_INT),
    st.builds(
        Ack,
        message_ids=st.lists(_ID, max_size=3),
        cumulative=st.booleans(),
        request_id=st.integers(0, 1000),
    ),
    st.builds(Nack, message_ids=st.lists(_ID, max_size=3)),
).map(frames.encode)
_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "seq": _or_any(_SMALL),
    "payload": _or_any(st.binary(max_size=LIMIT + 100)),
    "key": _or_any(st.none() | st.text(max_size=8)),
    "properties": _or_any(st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2)),
    "event_time_ms": _or_any(_SMALL),
    "permits": _or_any(_SMALL),
    "message_ids": _or_any(st.lists(_ID, max_size=3)),
    "cumulative": _or_any(st.booleans()),
    "request_id": _or_any(st.integers(0, 1000)),
    "bogus": _ANY,
}
_ALMOST = st.fixed_dictionaries(
    {"type": _or_any(st.sampled_from(["send", "send_batch", "flow", "ack", "nack", "error"]))},
    optional={
        **_FIELDS,
        "sends": st.lists(
            st.fixed_dictionaries(
                {"type": st.just("send")},
                optional={"seq": _FIELDS["seq"], "payload": _FIELDS["payload"]},
            ),
            max_size=3,
        ),
    },
).map(_pack)


WIRE = st.one_of(
    st.binary(max_size=48),
    _ANY.map(_pack),
    _ALMOST,
    _VALID,
    st.text(max_size=16),  # a text frame
)
_markers = itertools.count(0x5E_6700_0000)


@dataclass
class Fuzz:
    broker: BrokerServer
    http: aiohttp.ClientSession


@pytest.fixture
async def fuzz(stored: Stored, http: aiohttp.ClientSession) -> AsyncIterator[Fuzz]:
    """One broker for every example; after them all it still serves a new client."""
    yield Fuzz(stored.broker, http)
    await _still_serves(stored.broker.settings.advertise_url, TOPIC)


def _decode(decoder: msgspec.msgpack.Decoder[Any], data: bytes | str) -> Any:
    if isinstance(data, str):
        return None
    try:
        return decoder.decode(data)
    except (ValueError, RecursionError):  # msgspec's errors, bad UTF-8, deep nesting
        return None


async def _send(ws: aiohttp.ClientWebSocketResponse, data: bytes | str) -> None:
    if isinstance(data, str):
        await ws.send_str(data)
    else:
        await ws.send_bytes(data)


class Produced:
    """What one producer name had stored before a frame: its seqs, and the highest."""

    def __init__(self) -> None:
        self.seqs: set[int] = set()

    @property
    def highest(self) -> int:
        return max(self.seqs, default=-1)


async def _fuzz_producer(
    ws: aiohttp.ClientWebSocketResponse, data: bytes | str, stored: Produced
) -> None:
    frame = _decode(frames.producer_input, data)
    await _send(ws, data)
    if frame is None:
        error = await _error(ws)
        assert error.error == ErrorName.INVALID_MESSAGE and error.seq is None, (data, error)
        return
    sends = frame.sends if isinstance(frame, SendBatch) else [frame]
    if not sends:  # a batch of none: refused whole (it would get no answer at all)
        error = await _error(ws)
        assert error.error == ErrorName.INVALID_MESSAGE and error.seq is None, (data, error)
        return
    replies = [await _next(ws) for _ in sends]

    def outcome(send: Send) -> str:
        if send.seq < 0:
            return ErrorName.INVALID_MESSAGE.value
        if len(send.payload) > LIMIT:
            return ErrorName.MESSAGE_TOO_LARGE.value
        if send.event_time_ms is not None and not 0 <= send.event_time_ms < 2**63:
            return ErrorName.INVALID_MESSAGE.value  # times in ms are signed 64-bit
        if send.seq < stored.highest and send.seq not in stored.seqs:
            # below a seq stored before this frame, never stored itself: refused, as the
            # resend of a send refused on a lost connection is (docs/protocol.md)
            return ErrorName.SERVICE_NOT_READY.value
        return "stored"

    expected = sorted((s.seq, outcome(s)) for s in sends)
    # A send below the seq of one taken in before it in the frame (so possibly still being
    # written) is refused ServiceNotReady rather than stored after it (docs/protocol.md:
    # a gap, never an inversion), or is a duplicate once that one is stored.
    overtaken: set[int] = set()
    highest = -1
    for send in sends:
        if outcome(send) == "stored":
            if send.seq < highest:
                overtaken.add(send.seq)
            highest = max(highest, send.seq)
    got = []
    for reply in replies:
        if isinstance(reply, Error):
            assert reply.seq is not None, reply
            refused = reply.seq in overtaken and reply.error == ErrorName.SERVICE_NOT_READY
            got.append((reply.seq, "stored" if refused else reply.error))
        else:
            assert isinstance(reply, Receipt), reply
            got.append((reply.seq, "stored"))
            stored.seqs.add(reply.seq)
    assert sorted(got) == expected, (frame, replies)


async def _fuzz_consumer(ws: aiohttp.ClientWebSocketResponse, data: bytes | str) -> None:
    frame = _decode(frames.consumer_input, data)
    await _send(ws, data)
    # a marker frame whose error surely comes: what the frame caused is sent before it
    marker = next(_markers)
    await ws.send_bytes(frames.encode(Ack(message_ids=[(2**63, 0)], request_id=marker)))
    errors = []
    while True:
        reply = await _next(ws)
        if isinstance(reply, Error) and reply.request_id == marker:
            assert reply.error == ErrorName.INVALID_ARGUMENT
            break
        if isinstance(reply, AckReceipt | Message):  # a good ack; what the producer sent
            continue
        assert isinstance(reply, Error) and reply.error in KNOWN_ERRORS, (data, reply)
        errors.append(reply.error)
    if frame is None:
        assert errors == [ErrorName.INVALID_MESSAGE], (data, errors)
        return
    assert ErrorName.INVALID_MESSAGE not in errors, (frame, errors)
    if isinstance(frame, Flow):
        assert errors == ([] if frame.permits > 0 else [ErrorName.INVALID_ARGUMENT]), frame
    elif isinstance(frame, Ack | Nack) and any(i[0] > 2**32 or i[1] < 0 for i in frame.message_ids):
        assert errors == [ErrorName.INVALID_ARGUMENT], (frame, errors)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(wire=st.lists(WIRE, min_size=1, max_size=30))
@example(  # a send below one stored by an earlier frame, itself never stored: refused
    wire=[
        b"\x82\xa4type\xaasend_batch\xa5sends\x91\x83\xa4type\xa4send\xa3seq\x01\xa7payload\xc4\x00",
        b"\x83\xa4type\xa4send\xa3seq\x00\xa7payload\xc4\x00",
    ]
)
async def test_fuzzed_frames_get_named_errors_and_the_connection_stays(
    fuzz: Fuzz, wire: list[bytes | str]
) -> None:
    producer = await _producer(fuzz.http, fuzz.broker, PATH)
    consumer = await _consumer(fuzz.http, fuzz.broker, PATH, f"fuzz-{next(_ids)}")
    stored = Produced()
    try:
        for data in wire:
            await _fuzz_producer(producer, data, stored)
            await _fuzz_consumer(consumer, data)
        # both connections still serve good frames
        await producer.send_bytes(frames.encode(Send(seq=2**64 - 1, payload=b"last")))
        assert isinstance(await _next(producer), Receipt)
        await consumer.send_bytes(frames.encode(Flow(permits=0)))
        reply = await _next(consumer)
        while isinstance(reply, Message | AckReceipt):  # what the fuzzed flows allowed
            reply = await _next(consumer)
        assert isinstance(reply, Error) and reply.error == ErrorName.INVALID_ARGUMENT, reply
        assert not producer.closed and not consumer.closed
    finally:
        await producer.close()
        await consumer.close()
