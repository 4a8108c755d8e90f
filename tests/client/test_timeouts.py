"""Every client call ends within its time limit, whatever the broker does: a real
``segtxn standalone`` process paused with SIGSTOP (it answers nothing, yet the kernel still
accepts connections to its port), then resumed and used again."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass

import pytest

from segtxn.client import Client, ErrorCategory, Message, Timeout
from segtxn.client.timeouts import CLOSE_WAIT_S
from tests.processes import ServerProcess

OPERATION_S = 2.0
REQUEST_S = 0.5
SEND_S = 1.5
SLACK_S = 1.0
"""How late past its limit a call may end (a loaded 2-core machine: scheduling, not waits)."""

P = "persistent://acme/pause/events"
S = "topic://acme/pause/keyed"


@dataclass
class Outcome:
    elapsed_s: float
    error: BaseException | None


async def timed(call: Awaitable[object]) -> Outcome:
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        await call
    except Exception as e:
        return Outcome(loop.time() - started, e)
    return Outcome(loop.time() - started, None)


async def received(consumer: object, value: bytes) -> Message:
    """Receive until ``value`` comes (earlier sends whose outcome was unknown may come
    first); bounded by each receive's limit."""
    while True:
        message: Message = await consumer.receive(timeout_s=10)  # type: ignore[attr-defined]
        await consumer.acknowledge(message)  # type: ignore[attr-defined]
        if message.value == value:
            return message


@pytest.mark.slow
async def test_every_call_ends_within_its_limit_against_a_paused_broker(
    server: ServerProcess,
) -> None:
    async with Client(
        server.url, operation_timeout_s=OPERATION_S, request_timeout_s=REQUEST_S
    ) as client:
        await client.admin.create_topic(P)
        await client.admin.create_topic(S, segments=2)
        producer = await client.create_producer(P, send_timeout_s=SEND_S)
        unlimited = await client.create_producer(P, send_timeout_s=0)
        scalable = await client.create_producer(S, send_timeout_s=SEND_S)
        consumer = await client.subscribe(P, "sub", initial_position="earliest")
        other = await client.subscribe(P, "other", initial_position="earliest")
        for value in (b"m1", b"m2", b"m3"):
            await producer.send(value)
        m1, m2, m3 = [await consumer.receive(timeout_s=10) for _ in range(3)]
        # other's, left unacknowledged: it has nothing queued
        o1, _, _ = [await other.receive(timeout_s=10) for _ in range(3)]
        committing, aborting = client.transaction(), client.transaction()
        await producer.send(b"committed", txn=committing)
        await producer.send(b"aborted", txn=aborting)

        server.pause()
        try:
            stuck = await unlimited.send_async(b"stuck")  # no send limit: flush/close bound it
            limits: dict[str, tuple[Awaitable[object], float, ErrorCategory | None]] = {
                "send": (producer.send(b"lost?"), SEND_S, ErrorCategory.OUTCOME_UNKNOWN),
                "send (scalable, new segment producer)": (
                    scalable.send(b"k", key="k"),
                    SEND_S,
                    ErrorCategory.RETRIABLE,
                ),
                "send in a new transaction": (
                    producer.send(b"t", txn=client.transaction()),
                    SEND_S,
                    ErrorCategory.RETRIABLE,
                ),
                "acknowledge": (
                    consumer.acknowledge(m1),
                    OPERATION_S,
                    ErrorCategory.OUTCOME_UNKNOWN,
                ),
                "acknowledge(timeout_s=1)": (
                    consumer.acknowledge(m2, timeout_s=1.0),
                    1.0,
                    ErrorCategory.OUTCOME_UNKNOWN,
                ),
                "acknowledge in a new transaction": (
                    consumer.acknowledge(m3, txn=client.transaction()),
                    OPERATION_S,
                    ErrorCategory.RETRIABLE,
                ),
                "receive(timeout_s=1)": (other.receive(timeout_s=1.0), 1.0, None),
                "create_producer": (
                    client.create_producer(P),
                    OPERATION_S,
                    ErrorCategory.RETRIABLE,
                ),
                "subscribe": (client.subscribe(P, "new"), OPERATION_S, ErrorCategory.RETRIABLE),
                "subscribe (scalable)": (
                    client.subscribe(S, "new"),
                    OPERATION_S,
                    ErrorCategory.RETRIABLE,
                ),
                "create_reader(timeout_s=1)": (
                    client.create_reader(P, timeout_s=1.0),
                    1.0,
                    ErrorCategory.RETRIABLE,
                ),
                "admin stats": (client.admin.stats(P), OPERATION_S, ErrorCategory.RETRIABLE),
                "admin create_topic": (
                    client.admin.create_topic("persistent://acme/pause/new"),
                    OPERATION_S,
                    ErrorCategory.OUTCOME_UNKNOWN,
                ),
                "transaction start": (
                    client.transaction().start("v4"),
                    OPERATION_S,
                    ErrorCategory.RETRIABLE,
                ),
                "commit": (committing.commit(), OPERATION_S, ErrorCategory.OUTCOME_UNKNOWN),
                "abort(timeout_s=1)": (aborting.abort(timeout_s=1.0), 1.0, ErrorCategory.RETRIABLE),
                "flush(timeout_s=1)": (
                    unlimited.flush(timeout_s=1.0),
                    1.0,
                    ErrorCategory.OUTCOME_UNKNOWN,
                ),
            }
            ended = await asyncio.gather(*(timed(call) for call, _, _ in limits.values()))
            outcomes = dict(zip(limits, ended, strict=True))
            # calls that need no answer: they return (closing waits 1 s at most per socket)
            quick = {
                "negative_acknowledge": (other.negative_acknowledge(o1), OPERATION_S),
                "redeliver_unacknowledged": (other.redeliver_unacknowledged(), OPERATION_S),
                "producer close(timeout_s=1), a send in flight": (
                    unlimited.close(timeout_s=1.0),
                    1.0 + CLOSE_WAIT_S,
                ),
                "consumer close": (other.close(), CLOSE_WAIT_S),
            }
            ended = await asyncio.gather(*(timed(call) for call, _ in quick.values()))
            returned = dict(zip(quick, ended, strict=True))
        finally:
            server.resume()

        report = {name: (round(o.elapsed_s, 2), repr(o.error)[:90]) for name, o in outcomes.items()}
        report |= {name: (round(o.elapsed_s, 2), repr(o.error)) for name, o in returned.items()}
        print("\n".join(f"{name}: {r}" for name, r in report.items()))
        for name, (_, limit, category) in limits.items():
            outcome = outcomes[name]
            assert isinstance(outcome.error, Timeout), (name, outcome)
            assert isinstance(outcome.error, TimeoutError)  # the builtin, as aiohttp's are
            assert category is None or outcome.error.category is category, (name, outcome)
            assert limit * 0.9 <= outcome.elapsed_s <= limit + SLACK_S, (name, outcome)
        for name, (_, limit) in quick.items():
            outcome = returned[name]
            assert outcome.error is None and outcome.elapsed_s <= limit + SLACK_S, (name, outcome)
        with pytest.raises(Exception, match="closed"):
            await stuck  # closed before its receipt came

        # resumed: the same client goes on
        await producer.send(b"after")
        assert (await received(consumer, b"after")).value == b"after"
        await committing.commit()  # its outcome was unknown: asking again settles it
        assert await committing.status() == "COMMITTED"
        reader = await client.create_reader(P)
        assert (await reader.receive(timeout_s=10)).value == b"m1"
