"""``segtxn produce`` whose broker dies part-way stops once the producer has not been able to
reach a broker for the client's request timeout (10 s), not at its send timeout, and says
how many messages were stored and how many are of unknown outcome, ending with the words of
the send that failed, which may have been stored (a real standalone process, SIGKILLed under
a real ``segtxn produce``)."""

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
    code, out, err, took_s = _produce_and_kill(own_standalone)
    assert code == 1, (out, err)
    assert "Traceback" not in err, err
    last = err.splitlines()[-1]
    assert last.startswith("Error: failed ("), err
    assert "messages stored" in last and "cannot reach" in last, err
    assert "whether they were stored is unknown" in last, err  # the ones written
    assert "never sent (not stored)" in last, err  # the ones queued after the kill
    assert took_s < PROMPTLY_S, (took_s, err)


def test_produce_whose_broker_is_gone_says_the_send_that_failed_may_have_been_stored(
    own_standalone: processes.ServerProcess,
) -> None:
    """The failure that ended it is a send that was written and got no receipt
    (ConnectionLost, OUTCOME_UNKNOWN): its own words end the line (lost, may or may not
    have been stored, sending it again may store it twice). Before, the line ended as if
    no connection had ever been made: "cannot reach http://...: connection refused; is a
    segtxn broker running there?", of a broker that had stored messages a moment before."""
    code, out, err, _ = _produce_and_kill(own_standalone)
    assert code == 1, (out, err)
    assert "Traceback" not in err, err
    last = err.splitlines()[-1]
    failure = last.partition("): ")[2]  # after the progress, the error that stopped it
    assert failure.startswith("ConnectionLost: "), err
    assert "was lost" in failure and "cannot reach" in failure, err
    assert "may or may not have been stored" in failure, err
    assert "is a segtxn broker running there" not in last, err
    assert "ConnectionKey" not in last, err  # in words


def _produce_and_kill(server: processes.ServerProcess) -> tuple[int, str, str, float]:
    """Run ``segtxn produce`` of more messages than it can send, SIGKILL ``server`` once
    some are stored; returns its exit status, stdout, stderr, and the seconds it took to
    stop after the kill (bounded: a produce still running then is killed)."""
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
    return producing.returncode, out, err, took_s


async def _created(url: str, topic: str) -> None:
    async with Client(url) as client:
        await client.admin.create_topic(topic)
