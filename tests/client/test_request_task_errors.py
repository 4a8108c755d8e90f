"""A consumer stream's redelivery request that fails to be written, with an error that is
neither aiohttp's nor a ConnectionError, after its caller gave up (found by a reviewer: the
stream's task that owns the request ended with that error, and asyncio logged "Task
exception was never retrieved" with a traceback; the messages the stream had dropped for
the request never came back, as no rewind answered it). Now the stream says so at WARNING
and attaches again, which starts from a rewind (segtxn/client/stream.py); and no task of the
stream leaves an error for asyncio to report."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from segtxn.client import Client
from segtxn.client.errors import Timeout
from segtxn.client.stream import MessageStream
from segtxn.protocol import frames
from segtxn.protocol.errors import ServiceNotReady
from tests.client.test_redelivery_requests import setup, stream_of, values
from tests.cluster import Cluster
from tests.waiting import wait_until

FAULTS = ["server error on the socket", "bug on the socket", "bug in the stream"]


def inject(stream: MessageStream, fault: str, monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Make the next write of a Nack fail with ``fault``: raised by the WebSocket's send
    (the HTTP call) or by the stream's own bookkeeping before it. Set once it has."""
    failed = asyncio.Event()
    if fault == "bug in the stream":
        take = stream._acks.take

        def failing_take() -> list[frames.Ack]:
            if not failed.is_set():
                failed.set()
                raise RuntimeError("injected: a bug")
            return take()

        monkeypatch.setattr(stream._acks, "take", failing_take)
        return failed
    ws = stream._ws
    assert ws is not None
    send_bytes = ws.send_bytes
    error = ServiceNotReady("injected: a server error") if "server" in fault else None

    async def failing(data: bytes, *args: Any, **kwargs: Any) -> None:
        if not failed.is_set() and isinstance(frames.consumer_input.decode(data), frames.Nack):
            failed.set()
            raise error or RuntimeError("injected: a bug")
        await send_bytes(data, *args, **kwargs)

    monkeypatch.setattr(ws, "send_bytes", failing)
    return failed


@contextmanager
def asyncio_reports() -> Iterator[list[dict[str, Any]]]:
    """What asyncio reports meanwhile (an error never retrieved: once its task is freed)."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        yield reported
        gc.collect()
    finally:
        loop.set_exception_handler(None)


def unretrieved(reported: list[dict[str, Any]]) -> list[str]:
    return [
        f"{c['message']}: {c.get('exception')!r}"
        for c in reported
        if "never retrieved" in str(c.get("message"))
    ]


def injected(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "injected" in r.getMessage()]


@pytest.mark.parametrize("cluster", ["memory"], indirect=True)
@pytest.mark.parametrize("fault", FAULTS)
async def test_a_request_failing_after_its_caller_gave_up_is_reported_and_recovered(
    client: Client,
    cluster: Cluster,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    fault: str,
) -> None:
    consumer, (m0,) = await setup(client, 4)
    stream = stream_of(consumer)
    with (
        caplog.at_level(logging.WARNING, logger="segtxn.client.stream"),
        asyncio_reports() as reported,
    ):
        async with stream._writing:  # the nack waits to be written: its caller gives up
            failed = inject(stream, fault, monkeypatch)
            with pytest.raises(Timeout):
                await consumer.negative_acknowledge(m0, timeout_s=0.2)
        async with asyncio.timeout(10):
            await failed.wait()
        await wait_until(lambda: not stream._writes, what="the request's task ended")
    assert not unretrieved(reported), unretrieved(reported)
    warned = injected(caplog)
    assert [r.levelno for r in warned] == [logging.WARNING], caplog.text
    assert "attaching again" in warned[0].getMessage()
    # what the stream dropped for the request comes back, in order
    assert await values(consumer, 4) == ["m0", "m1", "m2", "m3"]
    assert not stream._awaiting


@pytest.mark.parametrize("cluster", ["memory"], indirect=True)
async def test_an_ack_task_that_fails_is_reported(
    client: Client,
    cluster: Cluster,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Gathered acks are written by a task of the stream that nobody awaits: an error of
    its own (a bug) is logged at WARNING, not left for asyncio to report."""
    consumer, (m0,) = await setup(client, 4)
    stream = stream_of(consumer)
    with (
        caplog.at_level(logging.WARNING, logger="segtxn.client.stream"),
        asyncio_reports() as reported,
    ):
        failed = inject(stream, "bug in the stream", monkeypatch)
        with pytest.raises(Timeout):  # its receipt never comes: it was never written
            await consumer.acknowledge(m0, timeout_s=0.5)
        assert failed.is_set()
        await wait_until(lambda: not stream._writes, what="the ack task ended")
    assert not unretrieved(reported), unretrieved(reported)
    warned = injected(caplog)
    assert [r.levelno for r in warned] == [logging.WARNING], caplog.text
    assert "acks" in warned[0].getMessage()
