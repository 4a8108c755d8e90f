"""Bad input before the WebSocket upgrade: a data-plane request whose path or query the broker
refuses is an HTTP error with its name in the ``X-Segtxn-Error`` header and a JSON body
``{"error", "message"}``.

Covers unknown topics and domains, invalid topic and subscription names, bad query arguments
(``type``, ``initial``, ``name``, ``start``), producing to a scalable topic directly, and a
topic another broker owns (307 ``NotOwner`` with a ``Location`` the client follows). What is
refused after the upgrade is in test_bad_frames.py and test_bad_frames_fuzz.py.
"""

from __future__ import annotations

import uuid

import aiohttp
import pytest

from segtxn.broker.app import BrokerServer
from segtxn.client import Client
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.protocol import frames
from segtxn.protocol.errors import ErrorName
from segtxn.protocol.frames import ProducerReady, Receipt, Send
from segtxn.protocol.names import TopicName
from tests.broker.bad_input_support import KNOWN_ERRORS, PATH
from tests.broker.bad_input_support import next_server_frame as _next
from tests.broker.bad_input_support import still_serves as _still_serves
from tests.broker.conftest import StartBroker

_UPGRADE = {
    "Upgrade": "websocket",
    "Connection": "Upgrade",
    "Sec-WebSocket-Version": "13",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
}


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
