"""A producer connection's one-step commits (segtxn/client/commitchannel.py) on their own:
what is written, how answers and errors reach the commit that waits, and what a lost
connection or an unreadable frame does. The real broker's side: tests/txn/test_commit_frame.py."""

from __future__ import annotations

import asyncio

import pytest

from segtxn.client.commitchannel import CommitChannel
from segtxn.protocol.errors import InvalidMessage, InvalidTxnStatus, ServiceNotReady
from segtxn.protocol.frames import Commit, CommitAnswer, Error
from segtxn.protocol.txn import TxnId

TXN = TxnId(1 << 48 | 1, 7)


def _channel() -> tuple[CommitChannel, asyncio.Event]:
    """A channel, and the event its writer would be woken by."""
    woken = asyncio.Event()
    return CommitChannel(woken.set), woken


async def _asked(
    channel: CommitChannel, woken: asyncio.Event
) -> tuple[asyncio.Task[CommitAnswer], Commit]:
    """A commit waiting on ``channel``, and the frame its writer takes."""
    asking = asyncio.create_task(channel.commit(TXN, 3, 42, 10))
    async with asyncio.timeout(10):
        await woken.wait()
    woken.clear()
    (frame,) = channel.take()
    return asking, frame


async def test_the_frame_names_the_commit_and_its_answer_comes_back() -> None:
    channel, woken = _channel()
    asking, frame = await _asked(channel, woken)
    assert (frame.txn, frame.ops, frame.digest) == ((TXN.most, TXN.least), 3, 42)
    channel.answered(CommitAnswer(request_id=frame.request_id + 1, state="OPEN"))  # not its
    channel.answered(CommitAnswer(request_id=frame.request_id, state="COMMITTED"))
    assert (await asking).state == "COMMITTED"
    assert channel.take() == []  # written once


async def test_an_error_by_request_id_is_raised_by_its_commit() -> None:
    channel, woken = _channel()
    asking, frame = await _asked(channel, woken)
    channel.answered(
        Error(error="InvalidTxnStatus", message="aborted", request_id=frame.request_id)
    )
    with pytest.raises(InvalidTxnStatus):
        await asking


async def test_a_lost_connection_fails_what_waits_and_forgets_what_is_queued() -> None:
    channel, woken = _channel()
    channel.broker_url = "http://b1"
    asking, _ = await _asked(channel, woken)
    queued = asyncio.create_task(channel.commit(TXN, 1, 1, 10))
    async with asyncio.timeout(10):
        await woken.wait()  # queued, not yet taken by the writer
    channel.lost("gone")
    with pytest.raises(ConnectionError):
        await asking
    with pytest.raises(ConnectionError):
        await queued
    assert channel.take() == [] and channel.broker_url is None


async def test_an_unnamed_invalid_message_is_a_commit_an_older_broker_could_not_read() -> None:
    channel, woken = _channel()
    assert not channel.unreadable(InvalidMessage("bad frame"))  # none waits: not a commit's
    asking, _ = await _asked(channel, woken)
    assert not channel.unreadable(ServiceNotReady("busy"))  # another error: not a refusal
    assert channel.supported
    assert channel.unreadable(InvalidMessage("bad frame"))
    with pytest.raises(InvalidMessage):
        await asking
    assert not channel.supported  # later commits go over HTTP
