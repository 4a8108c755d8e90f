"""A WebSocket lives no longer than the token it was opened with: when the token expires
(plus the tolerated clock skew) the broker closes it with 1008 ``Unauthenticated``, and the
client, whose reconnect is then refused, hands the error to the application instead of
trying again for ever."""

from __future__ import annotations

import aiohttp
import pytest

from segtxn.auth.tokens import LEEWAY_S
from segtxn.client import Client
from segtxn.protocol import frames
from segtxn.protocol.errors import ErrorName, ServerError
from tests.auth.conftest import CONSUMER, PRODUCER, ROOT, SecureCluster, bearer, token
from tests.wsframes import next_frame

TOPIC = "persistent://acme/orders/expiring"
SHORT_S = 1.0
"""The tokens' life here: the broker closes LEEWAY_S after it."""


SCALABLE = "topic://acme/orders/expiring"


@pytest.fixture
async def topic(secure: SecureCluster) -> SecureCluster:
    async with Client(secure.url, token=token(ROOT)) as client:
        await client.admin.create_topic(TOPIC)
        await client.admin.create_topic(SCALABLE, segments=2)
    return secure


async def test_the_broker_closes_a_websocket_when_its_token_expires(topic: SecureCluster) -> None:
    url = f"{topic.url}/ws/v2/producer/persistent/acme/orders/expiring?name=short"
    async with aiohttp.ClientSession() as http:
        short = bearer(token(PRODUCER, ttl_s=SHORT_S))
        async with http.ws_connect(url, headers=short) as ws:
            assert isinstance(await next_frame(ws), frames.ProducerReady)
            closed = await ws.receive(timeout=SHORT_S + LEEWAY_S + 10)
            assert closed.type is aiohttp.WSMsgType.CLOSE
            assert closed.data == aiohttp.WSCloseCode.POLICY_VIOLATION
            assert closed.extra == "Unauthenticated: the token expired"
        async with http.ws_connect(url, headers=bearer(token(PRODUCER))) as ws:  # a new one
            assert isinstance(await next_frame(ws), frames.ProducerReady)


@pytest.mark.parametrize("name", [TOPIC, SCALABLE])
async def test_the_client_hands_the_refusal_to_the_application(
    topic: SecureCluster, name: str
) -> None:
    """Also on a scalable topic, whose lookup session stops instead of retrying."""
    async with Client(topic.url, token=token(CONSUMER, ttl_s=SHORT_S)) as client:
        consumer = await client.subscribe(name, "s")
        with pytest.raises(ServerError) as caught:
            await consumer.receive(timeout_s=SHORT_S + LEEWAY_S + 15)
        assert caught.value.name is ErrorName.UNAUTHENTICATED
        assert "expired" in caught.value.message
