"""Calls from one broker to another (split/merge steps on a segment's home broker) when the
peer cannot be reached: a retriable ServiceNotReady, never a 500."""

from __future__ import annotations

import aiohttp
import pytest

from segtxn.broker.controllers import HttpSegmentOps
from segtxn.metastore.etcd_server import free_port
from segtxn.protocol.errors import ErrorName, ServerError


async def test_an_unreachable_peer_broker_is_service_not_ready() -> None:
    dead = f"http://127.0.0.1:{free_port()}/admin/v2/segment/a/b/c/0/subscriptions"
    async with aiohttp.ClientSession() as http:
        ops = HttpSegmentOps(catalog=None, http=http)  # type: ignore[arg-type]
        with pytest.raises(ServerError) as error:
            await ops._call("GET", dead)
    assert error.value.name is ErrorName.SERVICE_NOT_READY
    assert "did not answer" in error.value.message
