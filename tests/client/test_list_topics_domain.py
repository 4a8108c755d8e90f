"""``client.admin.list_topics(domain, tenant, namespace)`` with a domain written as in a
topic name (``"persistent://"``) is refused by the client, saying what it takes, as a
malformed tenant or namespace is: it used to reach the broker as the path
``/admin/v2/persistent:///t/ns`` and come back as "no such endpoint"."""

from __future__ import annotations

import pytest

from segtxn.client import Client, InvalidTopicName
from segtxn.metastore.etcd_server import free_port


@pytest.mark.parametrize("domain", ["persistent://", "topic://", "segment", "Persistent", ""])
async def test_a_domain_that_lists_nothing_is_refused_before_any_request(domain: str) -> None:
    # nothing listens there: a request would fail with ServiceNotReady, not this
    async with Client(f"http://127.0.0.1:{free_port()}", operation_timeout_s=1) as client:
        with pytest.raises(InvalidTopicName, match="persistent or topic"):
            await client.admin.list_topics(domain, "t", "ns")
