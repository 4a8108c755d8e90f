"""A broker that cannot be reached is said in words by the Python client, as the command
line says it: ``cannot reach http://...: connection refused``, never aiohttp's
``ClientConnectorError(ConnectionKey(host=..., proxy_headers_hash=None, ...), ...)``."""

from __future__ import annotations

import pytest

from segtxn.client import Client, ServiceNotReady, Timeout
from segtxn.metastore.etcd_server import free_port


async def test_a_refused_connection_is_said_in_words() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with Client(url, operation_timeout_s=1) as client:
        with pytest.raises(ServiceNotReady) as refused:
            await client.admin.stats("topic://a/b/c")
        with pytest.raises(Timeout) as timed_out:
            await client.create_producer("topic://a/b/c")
    said = str(refused.value)
    assert said.endswith(f"cannot reach {url}/admin/v2/topic/a/b/c/stats: connection refused")
    assert "connection refused" in str(timed_out.value)
    for text in (said, str(timed_out.value)):
        assert "ConnectionKey" not in text and "ClientConnectorError" not in text, text
