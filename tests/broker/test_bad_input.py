"""Bad input to the data plane: every malformed request gets its named error, and the broker
stays up for the next client.

Before the WebSocket upgrade a problem is an HTTP error (``X-Segtxn-Error`` header and a
JSON body ``{"error", "message"}``); after it, every bad frame is answered with an ``Error``
frame and the connection stays open; only a frame over twice the message limit closes it
(code 1009). Hypothesis throws random bytes, random msgpack values and almost-right frames at
a producer and a consumer.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import WSCloseCode, WSMsgType
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from segtxn.broker.app import BrokerServer
from segtxn.client import Client
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.protocol import frames
from segtxn.protocol.errors import ErrorName
from segtxn.protocol.frames import (
    Ack,
    AckReceipt,
    ConsumerReady,
    Error,
    Flow,
    Message,
    Nack,
    ProducerReady,
    Receipt,
    Send,
    SendBatch,
)
from segtxn.protocol.names import TopicName
from tests.broker.conftest import StartBroker
from tests.wsframes import next_frame

_UPGRADE = {
    "Upgrade": "websocket",
    "Connection": "Upgrade",
    "Sec-WebSocket-Version": "13",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
}
LIMIT = 1000  # max_message_bytes of the brokers here that need a small one
KNOWN_ERRORS = {e.value for e in ErrorName}
_ids = itertools.count(1)


# ---------------------------------------------------------------------- helpers


async def _next(ws: aiohttp.ClientWebSocketResponse) -> frames.Frame:
    """The next server frame, within a bounded time; fails on anything but a binary frame."""
    return await next_frame(ws, 5)


async def _error(ws: aiohttp.ClientWebSocketResponse) -> Error:
    frame = await _next(ws)
    assert isinstance(frame, Error), frame
    assert frame.error in KNOWN_ERRORS
    return frame


async def _producer(
    http: aiohttp.ClientSession, broker: BrokerServer, path: str, name: str | None = None
) -> aiohttp.ClientWebSocketResponse:
    url = f"{broker.settings.advertise_url}/ws/v2/producer/{path}"
    ws = await http.ws_connect(url, params={"name": name or f"raw-{next(_ids)}"})
    assert isinstance(await _next(ws), ProducerReady)
    return ws


async def _consumer(
    http: aiohttp.ClientSession,
    broker: BrokerServer,
    path: str,
    subscription: str,
    initial: str = "latest",
) -> aiohttp.ClientWebSocketResponse:
    url = f"{broker.settings.advertise_url}/ws/v2/consumer/{path}/{subscription}"
    ws = await http.ws_connect(url, params={"initial": initial})
    assert isinstance(await _next(ws), ConsumerReady)
    return ws


async def _refused(http: aiohttp.ClientSession, url: str, **params: str) -> tuple[int, str]:
    """Open a WebSocket that must be refused before the upgrade: (status, error name).

    Also checks, with a plain GET, that the body is ``{"error": NAME, "message": ...}``."""
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        ws = await http.ws_connect(url, params=params)
        await ws.close()
    status = refused.value.status
    headers = refused.value.headers
    assert headers is not None, f"{url}: no headers on the refusal"
    name = headers.get("X-Segtxn-Error", "")
    assert name in KNOWN_ERRORS, f"{url}: status {status} without a named error: {headers!r}"
    async with http.get(url, params=params, allow_redirects=False) as response:
        assert response.status == status
        body = await response.json()
    assert body["error"] == name and isinstance(body["message"], str) and body["message"]
    return status, name


async def _still_serves(url: str, topic: str) -> None:
    """A brand-new client can produce to ``topic`` and consume what it produced."""
    tag = next(_ids)
    async with Client(url) as client:
        consumer = await client.subscribe(topic, f"check-{tag}")
        producer = await client.create_producer(topic, name=f"check-{tag}")
        sent = await producer.send(b"still serving")
        message = await consumer.receive(timeout_s=10)
        assert message.message_id == sent and message.value == b"still serving"
        await consumer.acknowledge(message)


def _pack(value: Any) -> bytes:
    return msgspec.msgpack.encode(value)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def small(start_broker: StartBroker) -> BrokerServer:
    """A broker with a 1000-byte message limit and the topic ``persistent://acme/bad/t``."""
    broker = await start_broker(max_message_bytes=LIMIT)
    async with Client(broker.settings.advertise_url) as client:
        await client.admin.create_topic("persistent://acme/bad/t")
    return broker


TOPIC = "persistent://acme/bad/t"
PATH = "persistent/acme/bad/t"


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


# ---------------------------------------------------------------------- handshake refusals


@pytest.mark.parametrize(
    "path",
    [
        "producer/persistent/acme/bad/missing",
        "consumer/persistent/acme/bad/missing/sub",
        "reader/persistent/acme/bad/missing",
        "producer/persistent/nobody/bad/t",
        "producer/segment/acme/bad/t/0",
        "consumer/segment/acme/bad/t/7/sub",
    ],
)
async def test_unknown_topic_is_topic_not_found(
    small: BrokerServer, http: aiohttp.ClientSession, path: str
) -> None:
    url = f"{small.settings.advertise_url}/ws/v2/{path}"
    assert await _refused(http, url) == (404, ErrorName.TOPIC_NOT_FOUND)


@pytest.mark.parametrize(
    "path",
    [
        "producer/persistent/-acme/bad/t",
        "producer/persistent/acme/bad ns/t",
        "producer/persistent/acme/bad/t!",
        f"producer/persistent/acme/bad/{'x' * 200}",
        "consumer/persistent/acme/_bad/t/sub",
        "reader/persistent/acme/bad/t~",
        "producer/segment/acme/bad/t/1234567890123456789",
    ],
)
async def test_invalid_topic_name_is_invalid_topic_name(
    small: BrokerServer, http: aiohttp.ClientSession, path: str
) -> None:
    url = f"{small.settings.advertise_url}/ws/v2/{path}"
    assert await _refused(http, url) == (400, ErrorName.INVALID_TOPIC_NAME)


async def test_producing_to_a_scalable_topic_directly_is_not_allowed(
    small: BrokerServer, http: aiohttp.ClientSession
) -> None:
    url = f"{small.settings.advertise_url}/ws/v2/producer/topic/acme/bad/t"
    assert await _refused(http, url) == (405, ErrorName.NOT_ALLOWED)


@pytest.mark.parametrize(
    "path", ["producer/kafka/acme/bad/t", "consumer/kafka/acme/bad/t/sub", "reader/x/acme/bad/t"]
)
async def test_unknown_domain_is_a_named_error(
    small: BrokerServer, http: aiohttp.ClientSession, path: str
) -> None:
    url = f"{small.settings.advertise_url}/ws/v2/{path}"
    status, name = await _refused(http, url)
    assert 400 <= status < 500 and name == ErrorName.INVALID_TOPIC_NAME


@pytest.mark.parametrize("subscription", ["bad name!", "-x", "x" * 200, "_x", "caf\u00e9", ":x"])
async def test_bad_subscription_name_is_invalid_argument(
    small: BrokerServer, http: aiohttp.ClientSession, subscription: str
) -> None:
    url = f"{small.settings.advertise_url}/ws/v2/consumer/{PATH}/{subscription}"
    assert await _refused(http, url) == (400, ErrorName.INVALID_ARGUMENT)


@pytest.mark.parametrize(
    ("kind", "params"),
    [
        ("consumer", {"type": "Nope"}),
        ("consumer", {"type": ""}),
        ("consumer", {"type": "exclusive"}),
        ("consumer", {"initial": "middle"}),
        ("consumer", {"name": "bad name"}),
        ("producer", {"name": "-p"}),
        ("producer", {"name": "p" * 129}),
        ("reader", {"start": "zz"}),
        ("reader", {"start": "1:"}),
    ],
)
async def test_bad_query_argument_is_invalid_argument(
    small: BrokerServer, http: aiohttp.ClientSession, kind: str, params: dict[str, str]
) -> None:
    suffix = "/sub" if kind == "consumer" else ""
    url = f"{small.settings.advertise_url}/ws/v2/{kind}/{PATH}{suffix}"
    assert await _refused(http, url, **params) == (400, ErrorName.INVALID_ARGUMENT)


# ---------------------------------------------------------------------- consumer frames


@dataclass
class Stored:
    broker: BrokerServer
    ledger_id: int
    entry_id: int


@pytest.fixture
async def stored(small: BrokerServer) -> Stored:
    """One message stored on ``persistent://acme/bad/t``."""
    async with Client(small.settings.advertise_url) as client:
        producer = await client.create_producer(TOPIC, name="stored")
        message_id = await producer.send(b"stored")
    return Stored(small, message_id.ledger_id, message_id.entry_id)


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


# ---------------------------------------------------------------------- another broker's topic


async def test_topic_of_another_broker_is_not_owner_with_a_redirect(
    start_broker: StartBroker, etcd_server: EtcdServer, http: aiohttp.ClientSession
) -> None:
    store = etcd_server.url(f"/badinput-{uuid.uuid4().hex}")
    a = await start_broker(store_url=store)
    b = await start_broker(store_url=store)
    a_url, b_url = a.settings.advertise_url, b.settings.advertise_url
    async with Client(a_url) as client:
        for i in range(6):
            topic = f"persistent://acme/owned/t{i}"
            await client.admin.create_topic(topic)
            if (await client.connector.lookup(TopicName.parse(topic)))["brokerUrl"] == b_url:
                break
        else:
            pytest.fail("no topic was placed on the second broker")
        path = TopicName.parse(topic).path
        for kind, suffix, params in [
            ("producer", "", {"name": "p1"}),
            ("consumer", "/sub", {"type": "Shared"}),
            ("reader", "", {"start": "earliest"}),
        ]:
            url = f"/ws/v2/{kind}/{path}{suffix}"
            # the WebSocket handshake, without following the redirect
            async with http.get(
                a_url + url, params=params, headers=_UPGRADE, allow_redirects=False
            ) as response:
                assert response.status == 307
                assert response.headers["X-Segtxn-Error"] == ErrorName.NOT_OWNER
                location = response.headers["Location"]
                assert location.startswith(b_url + url + "?"), location
                body = await response.json()
                assert body["error"] == ErrorName.NOT_OWNER and body["message"]
        # aiohttp's ws_connect follows the 307 by itself: a raw socket lands on b
        ws = await http.ws_connect(a_url + f"/ws/v2/producer/{path}", params={"name": "raw"})
        try:
            assert isinstance(await _next(ws), ProducerReady)
            await ws.send_bytes(frames.encode(Send(seq=0, payload=b"raw via redirect")))
            assert isinstance(await _next(ws), Receipt)
        finally:
            await ws.close()
        assert not a.service.topics and TopicName.parse(topic) in b.service.topics
        # the client, pointed at the wrong broker, follows the redirect
        ws = await client.connector.websocket(
            a_url, "producer", TopicName.parse(topic), "", {"name": "follower"}
        )
        try:
            assert isinstance(await _next(ws), ProducerReady)
            await ws.send_bytes(frames.encode(Send(seq=0, payload=b"client via redirect")))
            assert isinstance(await _next(ws), Receipt)
        finally:
            await ws.close()
    await _still_serves(a_url, topic)


# ---------------------------------------------------------------------- hypothesis

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


async def _fuzz_producer(ws: aiohttp.ClientWebSocketResponse, data: bytes | str) -> None:
    frame = _decode(frames.producer_input, data)
    await _send(ws, data)
    if frame is None:
        error = await _error(ws)
        assert error.error == ErrorName.INVALID_MESSAGE and error.seq is None, (data, error)
        return
    sends = frame.sends if isinstance(frame, SendBatch) else [frame]
    replies = [await _next(ws) for _ in sends]

    def outcome(send: Send) -> str:
        if send.seq < 0:
            return ErrorName.INVALID_MESSAGE.value
        if len(send.payload) > LIMIT:
            return ErrorName.MESSAGE_TOO_LARGE.value
        if send.event_time_ms is not None and not 0 <= send.event_time_ms < 2**63:
            return ErrorName.INVALID_MESSAGE.value  # times in ms are signed 64-bit
        return "stored"

    expected = sorted((s.seq, outcome(s)) for s in sends)
    got = []
    for reply in replies:
        if isinstance(reply, Error):
            assert reply.seq is not None, reply
            got.append((reply.seq, reply.error))
        else:
            assert isinstance(reply, Receipt), reply
            got.append((reply.seq, "stored"))
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
async def test_fuzzed_frames_get_named_errors_and_the_connection_stays(
    fuzz: Fuzz, wire: list[bytes | str]
) -> None:
    producer = await _producer(fuzz.http, fuzz.broker, PATH)
    consumer = await _consumer(fuzz.http, fuzz.broker, PATH, f"fuzz-{next(_ids)}")
    try:
        for data in wire:
            await _fuzz_producer(producer, data)
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
