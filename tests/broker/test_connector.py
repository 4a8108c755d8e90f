"""The client's connector: a WebSocket handshake its caller gives up on is hung up, not left
open on the broker (where a lookup session holds a store watch until its heartbeat notices,
a minute later: found as a task leak at a test's end)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from segtxn.broker.app import BrokerServer
from segtxn.broker.http import SOCKETS
from segtxn.client import Client
from segtxn.protocol.names import TopicName
from tests.waiting import wait_until


async def test_an_abandoned_handshake_is_closed(client: Client, broker: BrokerServer) -> None:
    topic = TopicName.parse("topic://acme/conn/events")
    await client.admin.create_topic(str(topic), segments=1)
    connector = client.connector
    real = connector.session.ws_connect
    accepted, proceed = asyncio.Event(), asyncio.Event()

    async def slow_return(*args: Any, **kwargs: Any) -> Any:
        ws = await real(*args, **kwargs)  # the broker has accepted the upgrade
        accepted.set()
        await proceed.wait()
        return ws

    connector.session.ws_connect = slow_return  # type: ignore[method-assign, assignment]  # a stand-in
    try:
        attempt = asyncio.create_task(
            connector.websocket(connector.service_url, "lookup", topic, "", {})
        )
        await asyncio.wait_for(accepted.wait(), 10)
        attempt.cancel()
        proceed.set()
        with pytest.raises(asyncio.CancelledError):
            await attempt
    finally:
        connector.session.ws_connect = real  # type: ignore[method-assign]
    sockets = broker.app[SOCKETS]
    await wait_until(
        lambda: all(ws.closed for ws in sockets), timeout=5, what="the broker's side closed"
    )
