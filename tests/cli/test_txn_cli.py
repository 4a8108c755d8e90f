"""`segtxn txn list|show|abort` against `segtxn standalone`, as a user runs them."""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from segtxn.client import Client
from tests import processes

SEGTXN = str(Path(sys.executable).with_name("segtxn"))


@pytest.fixture
async def standalone() -> AsyncIterator[str]:
    server = processes.standalone()
    server.start()
    try:
        await server.ready()
        yield server.url
    finally:
        server.stop()


async def segtxn(*args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        SEGTXN, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode or 0, out.decode()


async def test_list_show_and_abort(standalone: str) -> None:
    async with Client(standalone) as client:
        txn = await client.transaction(timeout_s=300).start()
        code, listed = await segtxn("txn", "list", "--url", standalone)
        assert code == 0 and str(txn.id) in listed and "OPEN" in listed
        code, shown = await segtxn("txn", "show", "--url", standalone, str(txn.id), "-o", "json")
        assert code == 0 and '"state": "OPEN"' in shown
        code, shown = await segtxn("txn", "show", "--url", standalone, str(txn.id))
        assert code == 0 and re.search(r"^state +OPEN$", shown, re.M) and "expires in" in shown
        code, aborted = await segtxn("txn", "abort", "--url", standalone, str(txn.id))
        assert code == 0 and "ABORTED" in aborted
        assert await txn.status() == "ABORTED"
        code, shown = await segtxn("txn", "show", "--url", standalone, str(txn.id))
        assert code == 0 and "expires in" not in shown  # decided: no deadline any more
        assert re.search(r"^timeout +300 s after it opened \(decided\)$", shown, re.M), shown
        code, bad = await segtxn("txn", "show", "--url", standalone, "not-an-id")
        assert code != 0 and "not a transaction id" in bad
        code, missing = await segtxn("txn", "abort", "--url", standalone, "1000000000000:ffff")
        assert code != 0 and "TransactionNotFound" in missing
