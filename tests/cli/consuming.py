"""A real ``segtxn consume`` under way on a filled subscription ``sub``: what the tests that
stop a consume or its server part-way share (tests/cli/test_consume_*.py)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from segtxn.client import Client
from tests import processes
from tests.waiting import wait_until

SUBSCRIPTION = "sub"


async def subscription_stat(client: Client, topic: str, stat: str) -> int:
    """One of ``sub``'s stats (``backlog``, ``consumers``)."""
    return int((await client.admin.stats(topic))["subscriptions"][SUBSCRIPTION][stat])


def filled(server: processes.ServerProcess, topic: str, messages: int) -> int:
    """Create ``topic`` and ``sub`` (from the earliest), send ``messages``; the backlog."""

    async def fill() -> int:
        async with Client(server.url) as client:
            await client.admin.create_topic(topic)
            await client.admin.create_subscription(topic, SUBSCRIPTION, initial_position="earliest")
            producer = await client.create_producer(topic)
            for i in range(messages):
                await producer.send_async(b"m%d" % i)
            await producer.flush()
            return await subscription_stat(client, topic, "backlog")

    return asyncio.run(fill())


def consume_under_way(
    server: processes.ServerProcess, topic: str, backlog: int, idle_timeout_s: float
) -> subprocess.Popen[str]:
    """Start ``segtxn consume topic sub`` and return once it has acknowledged some."""
    command = ["consume", topic, SUBSCRIPTION, "--idle-timeout", f"{idle_timeout_s:g}"]
    consuming = subprocess.Popen(
        [sys.executable, "-m", "segtxn.cli", *command, "--url", server.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    async def under_way() -> None:
        async with Client(server.url) as client:

            async def acknowledging() -> bool:
                assert consuming.poll() is None, consuming.communicate()
                return await subscription_stat(client, topic, "backlog") <= backlog - 2

            await wait_until(acknowledging, timeout=60, what="acknowledgments")

    try:
        asyncio.run(under_way())
    except BaseException:
        consuming.kill()
        consuming.communicate()
        raise
    return consuming
