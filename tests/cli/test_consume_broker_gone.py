"""``segtxn consume`` whose broker goes away: it must not end as if the subscription were
drained (a real standalone process, SIGKILLed under a real ``segtxn consume``)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator

import pytest

from segtxn.client import Client
from tests import processes
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(180)
TOPIC = "persistent://t/ns/broker-gone"
MESSAGES = 20_000


@pytest.fixture
def server() -> Iterator[processes.ServerProcess]:
    server = processes.standalone()
    server.start()
    try:
        asyncio.run(server.ready())
        yield server
    finally:
        server.stop()


async def _backlog(client: Client) -> int:
    return int((await client.admin.stats(TOPIC))["subscriptions"]["sub"]["backlog"])


def test_consume_whose_broker_is_gone_fails_instead_of_ending_idle(
    server: processes.ServerProcess,
) -> None:
    """The broker dies with thousands of messages left: consume stops at its idle timeout
    (nothing can arrive) and must say it failed (exit 1, "could not reach"), not end with
    exit 0 and "received N messages" as if it had consumed everything there was. Before, a
    script draining a subscription took a dead broker for an empty backlog."""

    async def prepare() -> int:
        async with Client(server.url) as client:
            await client.admin.create_topic(TOPIC)
            await client.admin.create_subscription(TOPIC, "sub", initial_position="earliest")
            producer = await client.create_producer(TOPIC)
            for i in range(MESSAGES):
                await producer.send_async(b"m%d" % i)
            await producer.flush()
            return await _backlog(client)

    left = asyncio.run(prepare())
    command = ["consume", TOPIC, "sub", "--idle-timeout", "2", "--url", server.url]
    consuming = subprocess.Popen(
        [sys.executable, "-m", "segtxn.cli", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        async def under_way() -> None:
            async with Client(server.url) as client:

                async def acknowledging() -> bool:
                    assert consuming.poll() is None, consuming.communicate()
                    return await _backlog(client) <= left - 2

                await wait_until(acknowledging, timeout=60, what="acknowledgments")

        asyncio.run(under_way())
        server.kill()
        out, err = consuming.communicate(timeout=120)
    finally:
        if consuming.poll() is None:
            consuming.kill()
            consuming.communicate()
    assert consuming.returncode == 1, (out, err)
    assert "Traceback" not in err, err
    last = err.splitlines()[-1]
    assert last.startswith("Error: failed ("), err
    assert "could not reach" in last and TOPIC in last, err
