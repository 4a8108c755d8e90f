"""``segtxn consume`` whose broker goes away: it must not end as if the subscription were
drained (a real standalone process, SIGKILLed under a real ``segtxn consume``)."""

from __future__ import annotations

import time

import pytest

from tests import processes
from tests.cli.consuming import consume_under_way, filled

pytestmark = pytest.mark.timeout(180)
TOPIC = "persistent://t/ns/broker-gone"
MESSAGES = 20_000
IDLE_TIMEOUT_S = 2
PROMPTLY_S = 25.0
"""Well under the client's 30 s acknowledgment timeout plus the idle timeout (about 32 s
before), over the 10 s its stream waits for a broker to come back plus the idle timeout."""


def test_consume_whose_broker_is_gone_fails_instead_of_ending_idle(
    own_standalone: processes.ServerProcess,
) -> None:
    """The broker dies with thousands of messages left: consume stops at its idle timeout
    (nothing can arrive) and must say it failed (exit 1, "could not reach"), not end with
    exit 0 and "received N messages" as if it had consumed everything there was. Before, a
    script draining a subscription took a dead broker for an empty backlog.

    And it says so promptly: the acknowledgment awaiting its answer at the kill fails once
    no broker could be reached for the client's request_timeout_s (ConnectionLost), so
    consume stops about that plus --idle-timeout after the kill. Before, that
    acknowledgment waited out the client's 30 s timeout first (the test took about 55 s)."""
    server = own_standalone
    consuming = consume_under_way(server, TOPIC, filled(server, TOPIC, MESSAGES), IDLE_TIMEOUT_S)
    try:
        server.kill()
        killed = time.monotonic()
        out, err = consuming.communicate(timeout=120)
        took_s = time.monotonic() - killed
    finally:
        if consuming.poll() is None:
            consuming.kill()
            consuming.communicate()
    assert consuming.returncode == 1, (out, err)
    assert "Traceback" not in err, err
    last = err.splitlines()[-1]
    assert last.startswith("Error: failed ("), err
    assert "could not reach" in last and TOPIC in last, err
    assert took_s < PROMPTLY_S, (took_s, err)
