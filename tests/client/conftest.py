"""A ``segtxn standalone`` process of the client tests' own, for tests that kill or pause
the server under the client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests import processes
from tests.processes import ServerProcess


@pytest.fixture
async def server() -> AsyncIterator[ServerProcess]:
    process = processes.standalone()
    process.start()
    try:
        await process.ready()
        yield process
    finally:
        process.stop()  # resumes it first if paused
