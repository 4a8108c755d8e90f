"""``segtxn produce`` whose broker dies part-way stops once the producer has not been able to
reach a broker for the client's request timeout (10 s), not at its send timeout, and says
how many messages were stored and how many are of unknown outcome (a real standalone
process, SIGKILLed under a real ``segtxn produce``)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from segtxn.client import Client
from tests import processes
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(180)
TOPIC = "persistent://t/ns/produce-broker-gone"
MESSAGES = 10_000_000
"""More than it can send before the kill."""
SEND_TIMEOUT_S = 120
PROMPTLY_S = 30.0
"""Well under the send timeout; the request timeout (10 s) and the last attempts' back-off."""


def test_produce_whose_broker_is_gone_stops_before_its_send_timeout(
    own_standalone: processes.ServerProcess,
) -> None:
    """Before, every send in flight at the kill waited out its send timeout first."""
    server = own_standalone
    asyncio.run(_created(server.url, TOPIC))
    command = ["produce", TOPIC, "-n", str(MESSAGES), "--send-timeout", str(SEND_TIMEOUT_S)]
    producing = subprocess.Popen(
        [sys.executable, "-m", "segtxn.cli", *command, "--url", server.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        async def stored() -> None:
            async with Client(server.url) as client:

                async def some() -> bool:
                    assert producing.poll() is None, producing.communicate()
                    return int((await client.admin.stats(TOPIC))["msgInCounter"]) > 100

                await wait_until(some, timeout=60, what="messages stored")

        asyncio.run(stored())
        server.kill()
        killed = time.monotonic()
        out, err = producing.communicate(timeout=SEND_TIMEOUT_S + 30)
        took_s = time.monotonic() - killed
    finally:
        if producing.poll() is None:
            producing.kill()
            producing.communicate()
    assert producing.returncode == 1, (out, err)
    assert "Traceback" not in err, err
    last = err.splitlines()[-1]
    assert last.startswith("Error: failed ("), err
    assert "messages stored" in last and "cannot reach" in last, err
    assert "whether they were stored is unknown" in last, err  # the ones written
    assert "never sent (not stored)" in last, err  # the ones queued after the kill
    assert took_s < PROMPTLY_S, (took_s, err)


async def _created(url: str, topic: str) -> None:
    async with Client(url) as client:
        await client.admin.create_topic(topic)
