"""Fixtures of the command-line tests."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from tests import processes


@pytest.fixture(scope="module")
def standalone() -> Iterator[str]:
    """The URL of a real ``segtxn standalone`` process (in-memory store), one per test
    module, stopped after it."""
    server = processes.standalone()
    server.start()
    try:
        asyncio.run(server.ready())
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def own_standalone() -> Iterator[processes.ServerProcess]:
    """A real ``segtxn standalone`` process of the test's own (in-memory store), for a test
    that kills or pauses it."""
    server = processes.standalone()
    server.start()
    try:
        asyncio.run(server.ready())
        yield server
    finally:
        server.stop()
