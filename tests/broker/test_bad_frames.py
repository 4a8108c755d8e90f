"""Bad frames after the WebSocket upgrade, written by hand: every malformed frame a producer,
consumer or reader sends is answered with an ``Error`` frame of its name and the connection
stays open; only a frame over twice the message limit closes it (code 1009). The broker stays
up for the next client.

Covers frames that are not a producer's or a consumer's (garbage, wrong types, missing or
mistyped fields, undecodable msgpack), seqs at and beyond their range, payloads over the
limit, acks and nacks of messages the topic never had, and permits below one. Refusals before
the upgrade are in test_bad_handshake.py; random frames in test_bad_frames_fuzz.py.
"""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import WSCloseCode, WSMsgType

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
from tests.broker.bad_input_support import LIMIT, PATH, TOPIC, Stored
from tests.broker.bad_input_support import error_frame as _error
from tests.broker.bad_input_support import ids as _ids
from tests.broker.bad_input_support import next_server_frame as _next
from tests.broker.bad_input_support import open_consumer as _consumer
from tests.broker.bad_input_support import open_producer as _producer
from tests.broker.bad_input_support import pack as _pack
from tests.broker.bad_input_support import still_serves as _still_serves

# ---------------------------------------------------------------------- producer frames

NOT_A_PRODUCER_FRAME = {
    "garbage bytes": b"\xc1\x00\xffnot msgpack",
    "empty message": b"",
    "truncated msgpack": _pack({"type": "send", "seq": 1, "payload": b"abc"})[:-2],
    "an integer": _pack(42),
    "a list": _pack([1, "send", b"x"]),
    "a map without a type": _pack({"seq": 1, "payload": b"x"}),
    "an unknown type": _pack({"type": "publish", "seq": 1, "payload": b"x"}),
    "a consumer frame": frames.encode(Flow(permits=10)),
    "a server frame": frames.encode(Receipt(seq=1, message_id=(1, 0))),
    "a send without payload": _pack({"type": "send", "seq": 1}),
    "a send without seq": _pack({"type": "send", "payload": b"x"}),
    "a string seq": _pack({"type": "send", "seq": "1", "payload": b"x"}),
    "a float seq": _pack({"type": "send", "seq": 1.5, "payload": b"x"}),
    "a seq beyond 64 bits": _pack({"type": "send", "seq": 1e30, "payload": b"x"}),
    "a text payload": _pack({"type": "send", "seq": 1, "payload": "text"}),
    "an unknown field": _pack({"type": "send", "seq": 1, "payload": b"x", "topic": "t"}),
    "non-string properties": _pack({"type": "send", "seq": 1, "payload": b"x", "properties": 1}),
    "a batch of non-sends": _pack({"type": "send_batch", "sends": [{"type": "flow"}]}),
}


async def test_producer_answers_every_bad_frame_and_keeps_the_connection(
    small: BrokerServer, http: aiohttp.ClientSession
) -> None:
    ws = await _producer(http, small, PATH)
    seq = 0
    for what, data in NOT_A_PRODUCER_FRAME.items():
        await ws.send_bytes(data)
        error = await _error(ws)
        assert error.error == ErrorName.INVALID_MESSAGE, what
        assert error.seq is None, what
        # the same connection still takes a good frame
        await ws.send_bytes(frames.encode(Send(seq=seq, payload=what.encode())))
        receipt = await _next(ws)
        assert isinstance(receipt, Receipt) and receipt.seq == seq, (what, receipt)
        assert not receipt.duplicate
        seq += 1
    await ws.send_str("frames are binary")
    assert (await _error(ws)).error == ErrorName.INVALID_MESSAGE
    await ws.send_bytes(frames.encode(Send(seq=seq, payload=b"after text")))
    assert isinstance(await _next(ws), Receipt)
    assert not ws.closed
    await ws.close()
    await _still_serves(small.settings.advertise_url, TOPIC)


async def test_largest_seq_is_stored_and_the_connection_stays(
    small: BrokerServer, http: aiohttp.ClientSession
) -> None:
    ws = await _producer(http, small, PATH)
    await ws.send_bytes(frames.encode(Send(seq=2**64 - 1, payload=b"top")))
    receipt = await _next(ws)
    assert isinstance(receipt, Receipt) and receipt.seq == 2**64 - 1 and not receipt.duplicate
    await ws.close()


@pytest.mark.parametrize("seq", [-1, -(2**63)])
async def test_negative_seq_is_refused(
    small: BrokerServer, http: aiohttp.ClientSession, seq: int
) -> None:
    ws = await _producer(http, small, PATH)
    await ws.send_bytes(frames.encode(Send(seq=seq, payload=b"negative")))
    reply = await _next(ws)
    await ws.close()
    assert isinstance(reply, Error), reply
    assert reply.error in (ErrorName.INVALID_MESSAGE, ErrorName.INVALID_ARGUMENT)
    assert reply.seq == seq


async def test_payload_over_the_limit_is_message_too_large(
    small: BrokerServer, http: aiohttp.ClientSession
) -> None:
    ws = await _producer(http, small, PATH)
    await ws.send_bytes(frames.encode(Send(seq=0, payload=b"x" * (LIMIT + 1))))
    error = await _error(ws)
    assert error.error == ErrorName.MESSAGE_TOO_LARGE and error.seq == 0
    await ws.send_bytes(frames.encode(Send(seq=1, payload=b"x" * LIMIT)))  # exactly the limit
    receipt = await _next(ws)
    assert isinstance(receipt, Receipt) and receipt.seq == 1
    # in a batch only the large one fails
    batch = SendBatch(sends=[Send(seq=2, payload=b"ok"), Send(seq=3, payload=b"y" * 2 * LIMIT)])
    await ws.send_bytes(frames.encode(batch))
    replies = {type(f).__name__: f for f in [await _next(ws), await _next(ws)]}
    assert isinstance(replies["Receipt"], Receipt) and replies["Receipt"].seq == 2
    too_large = replies["Error"]
    assert isinstance(too_large, Error)
    assert too_large.error == ErrorName.MESSAGE_TOO_LARGE and too_large.seq == 3
    assert not ws.closed
    await ws.close()


@pytest.mark.parametrize("kind", ["producer", "consumer"])
async def test_frame_over_twice_the_limit_closes_with_1009(
    small: BrokerServer, http: aiohttp.ClientSession, kind: str
) -> None:
    if kind == "producer":
        ws = await _producer(http, small, PATH)
    else:
        ws = await _consumer(http, small, PATH, f"big-{next(_ids)}")
    huge = frames.encode(Send(seq=0, payload=b"z" * (2 * LIMIT + 64 * 1024 + 1)))
    await ws.send_bytes(huge)
    message = await ws.receive(timeout=5)
    assert message.type is WSMsgType.CLOSE, message
    assert message.data == WSCloseCode.MESSAGE_TOO_BIG
    assert ws.close_code == WSCloseCode.MESSAGE_TOO_BIG
    await _still_serves(small.settings.advertise_url, TOPIC)


# msgspec refuses these with RecursionError or UnicodeDecodeError, not a DecodeError:
# the broker must answer them with InvalidMessage all the same
_NESTED = b"\x82\xa1x" + b"\x91" * 1100 + b"\xc0\xa4type\xa4send"  # {"x": [[[...]]], ...}
_BAD_UTF8_TYPE = b"\x81\xa4type\xa4\x00\x00\x00\x80"
_SEND_X = b"\xa4type\xa4send\xa3seq\x01\xa7payload\xc4\x01x"  # type, seq, payload of a map
ODDLY_UNDECODABLE = [
    ("producer", _NESTED),
    ("producer", _BAD_UTF8_TYPE),
    ("producer", b"\x84" + _SEND_X + b"\xa3key\xa2\xff\xfe"),  # an invalid UTF-8 key
    ("producer", b"\x84" + _SEND_X + b"\xaaproperties\x81\xa2\xff\xfe\xa1a"),
    ("producer", b"\x82\xa4type\xa4send\xa2\xff\xfe\x01"),  # an invalid UTF-8 field name
    ("consumer", _NESTED),
    ("consumer", _BAD_UTF8_TYPE),
    ("consumer", b"\x82\xa4type\xa3ack\xa2\xff\xfe\x01"),
]


@pytest.mark.parametrize(("kind", "data"), ODDLY_UNDECODABLE)
async def test_oddly_undecodable_frame_is_invalid_message(
    small: BrokerServer, http: aiohttp.ClientSession, kind: str, data: bytes
) -> None:
    if kind == "producer":
        ws = await _producer(http, small, PATH)
    else:
        ws = await _consumer(http, small, PATH, f"odd-{next(_ids)}")
    await ws.send_bytes(data)
    try:
        error = await _error(ws)
        assert error.error == ErrorName.INVALID_MESSAGE
        assert not ws.closed
    finally:
        await ws.close()
        await _still_serves(small.settings.advertise_url, TOPIC)


# ---------------------------------------------------------------------- consumer frames


async def test_consumer_answers_every_bad_frame_and_keeps_the_connection(
    stored: Stored, http: aiohttp.ClientSession
) -> None:
    ws = await _consumer(http, stored.broker, PATH, "subs", initial="earliest")
    ledger, entry = stored.ledger_id, stored.entry_id
    for permits in (0, -1, -(2**63)):
        await ws.send_bytes(frames.encode(Flow(permits=permits)))
        assert (await _error(ws)).error == ErrorName.INVALID_ARGUMENT, permits
    unknown = [
        [(ledger + 1, 0)],  # a ledger beyond the topic
        [(ledger, entry + 1)],  # an entry beyond the end
        [(ledger, -1)],  # a negative entry
        [(2**64 - 1, 2**64 - 1)],
        [(ledger, entry), (ledger, entry + 5)],  # one good, one unknown: refused as a whole
    ]
    for request_id, ids in enumerate(unknown, start=100):
        for cumulative in (False, True):
            await ws.send_bytes(
                frames.encode(Ack(message_ids=ids, cumulative=cumulative, request_id=request_id))
            )
            error = await _error(ws)
            assert error.error == ErrorName.INVALID_ARGUMENT, (ids, cumulative)
            assert error.request_id == request_id
        await ws.send_bytes(frames.encode(Nack(message_ids=ids)))
        assert (await _error(ws)).error == ErrorName.INVALID_ARGUMENT, ids
    not_consumer_frames = [
        b"\xc1",
        frames.encode(Send(seq=0, payload=b"x")),
        _pack({"type": "flow"}),
        _pack({"type": "flow", "permits": "10"}),
        _pack({"type": "ack", "message_ids": [[1]]}),
        _pack({"type": "ack", "message_ids": [["1", "0"]]}),
        _pack({"type": "ack", "message_ids": [[1, 0]], "request_id": -1.5}),
        _pack({"type": "nack", "message_ids": "1:0"}),
    ]
    for data in not_consumer_frames:
        await ws.send_bytes(data)
        assert (await _error(ws)).error == ErrorName.INVALID_MESSAGE, data
    await ws.send_str("hello")
    assert (await _error(ws)).error == ErrorName.INVALID_MESSAGE
    # nothing was acknowledged by the refused acks: the message comes, and acks for real
    await ws.send_bytes(frames.encode(Flow(permits=10)))
    message = await _next(ws)
    assert isinstance(message, Message) and message.payload == b"stored"
    assert message.message_id == (ledger, entry)
    await ws.send_bytes(frames.encode(Ack(message_ids=[(ledger, entry)], request_id=7)))
    assert await _next(ws) == AckReceipt(request_id=7)
    assert not ws.closed
    await ws.close()
    await _still_serves(stored.broker.settings.advertise_url, TOPIC)


async def test_reader_refuses_acks_and_bad_permits(
    stored: Stored, http: aiohttp.ClientSession
) -> None:
    url = f"{stored.broker.settings.advertise_url}/ws/v2/reader/{PATH}"
    ws = await http.ws_connect(url, params={"start": "earliest"})
    await ws.send_bytes(frames.encode(Ack(message_ids=[(stored.ledger_id, 0)], request_id=3)))
    assert (await _error(ws)).error == ErrorName.NOT_ALLOWED
    await ws.send_bytes(frames.encode(Flow(permits=0)))
    assert (await _error(ws)).error == ErrorName.INVALID_ARGUMENT
    await ws.send_bytes(b"\x00garbage")
    assert (await _error(ws)).error == ErrorName.INVALID_MESSAGE
    await ws.send_bytes(frames.encode(Flow(permits=1)))
    message = await _next(ws)
    assert isinstance(message, Message) and message.payload == b"stored"
    await ws.close()


@pytest.mark.parametrize("message_id", [(0, 0), (-1, 0), (-(2**63), 2**63)])
async def test_ack_of_a_ledger_the_topic_never_had_is_invalid_argument(
    stored: Stored, http: aiohttp.ClientSession, message_id: tuple[int, int]
) -> None:
    ws = await _consumer(http, stored.broker, PATH, f"never-{next(_ids)}")
    await ws.send_bytes(frames.encode(Ack(message_ids=[message_id], request_id=41)))
    reply = await _next(ws)
    await ws.close()
    assert isinstance(reply, Error), reply
    assert reply.error == ErrorName.INVALID_ARGUMENT and reply.request_id == 41


async def test_nack_of_a_ledger_the_topic_never_had_is_invalid_argument(
    stored: Stored, http: aiohttp.ClientSession
) -> None:
    ws = await _consumer(http, stored.broker, PATH, f"never-{next(_ids)}")
    await ws.send_bytes(frames.encode(Nack(message_ids=[(0, 0)])))
    # a marker whose error surely comes: the nack's error, if any, is sent before it
    await ws.send_bytes(frames.encode(Ack(message_ids=[(2**63, 0)], request_id=99)))
    reply = await _error(ws)
    await ws.close()
    assert reply.error == ErrorName.INVALID_ARGUMENT
    assert reply.request_id is None, "no error for the nack; the first is the marker's"


async def test_cumulative_ack_of_nothing_is_invalid_argument(
    stored: Stored, http: aiohttp.ClientSession
) -> None:
    ws = await _consumer(http, stored.broker, PATH, f"empty-{next(_ids)}")
    await ws.send_bytes(frames.encode(Ack(message_ids=[], cumulative=True, request_id=5)))
    reply = await _error(ws)
    await ws.close()
    assert reply.error == ErrorName.INVALID_ARGUMENT and reply.request_id == 5
