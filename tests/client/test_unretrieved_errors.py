"""No error of the client's own futures is left for asyncio to log ("Future exception was
never retrieved", a traceback each): the application awaits the futures it was given, and
the client takes in the outcome of every future it made for itself (a scalable producer's
per-segment sends), also when the application's future failed first."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from segtxn.client import Client, ConnectionLost, ErrorCategory, Timeout
from tests.processes import ServerProcess

T = "topic://acme/unretrieved/keyed"
SEND_S = 1.0
IN_FLIGHT = 200


async def test_sends_to_a_stopped_broker_fail_with_nothing_left_unretrieved(
    server: ServerProcess,
) -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        async with Client(server.url, operation_timeout_s=2.0, request_timeout_s=0.5) as client:
            await client.admin.create_topic(T, segments=2)
            producer = await client.create_producer(T, send_timeout_s=SEND_S)
            for i in range(20):  # a producer on each segment, connected
                await producer.send(b"before", key=f"k{i}")
            server.kill()
            futures = [await producer.send_async(b"%d" % i, key=f"k{i}") for i in range(IN_FLIGHT)]
            outcomes = await asyncio.gather(*futures, return_exceptions=True)
            # at the send timeout, or once no broker could be reached for request_timeout_s
            assert all(isinstance(o, Timeout | ConnectionLost) for o in outcomes), outcomes
            assert {o.category for o in outcomes if isinstance(o, Timeout)} <= {
                ErrorCategory.OUTCOME_UNKNOWN
            }
            del futures, outcomes
        gc.collect()  # a future whose error nobody retrieved says so when it is freed
    finally:
        loop.set_exception_handler(None)
    unretrieved = [c for c in reported if "never retrieved" in str(c.get("message"))]
    assert not unretrieved, f"{len(unretrieved)} unretrieved, e.g. {unretrieved[0]}"
