"""``segtxn topics`` when brokers are down or answers are lost: a split or merge whose answer
never came says it may or may not have happened and how to look; ``topics stats`` of a
``topic://`` shows the segments it could reach and marks the others (trial 2, M6 and M7)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from click.testing import CliRunner, Result

from segtxn.cli import main

T = "topic://t/ns/lost"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


@pytest.fixture
async def hangs_up() -> AsyncIterator[str]:
    """A server that reads each request and closes the connection without answering, as a
    broker killed after it took a request does."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError):  # a connect-only probe
            await reader.readuntil(b"\r\n\r\n")
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}"


@pytest.mark.parametrize(
    ("command", "change"),
    [
        (["split", T, "0"], f"the split of segment 0 of {T}"),
        (["merge", T, "1", "2"], f"the merge of segments 1 and 2 of {T}"),
    ],
)
async def test_a_split_or_merge_whose_answer_is_lost_may_have_happened(
    hangs_up: str, command: list[str], change: str
) -> None:
    result = await asyncio.to_thread(invoke, "topics", *command, "--url", hangs_up)
    assert result.exit_code == 1, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith("Error: the answer was lost (ServiceNotReady: cannot reach "), line
    assert "the server closed the connection" in line
    assert line.endswith(
        f"{change} may or may not have happened; 'segtxn topics stats {T}' shows its "
        "segments and last change"
    ), line
