"""Fixtures of the hostile trials: a cluster (tests/cluster.py) whose log must stay clean."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
import yarl

from tests.auth.conftest import secure  # noqa: F401 (a fixture: a cluster with security on)


@pytest.fixture(autouse=True)
def clean_log(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """No record at ERROR and no traceback: everything here is a client's mistake.

    Every phase's records are read: after the ``yield``, ``caplog.records`` holds only the
    teardown's, and read alone it let every line the test itself caused pass."""
    caplog.set_level(logging.INFO)
    yield
    records = [*caplog.get_records("setup"), *caplog.get_records("call"), *caplog.records]
    bad = [r for r in records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [f"{r.name}: {r.getMessage()}" for r in bad]


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def refusal(
    http: aiohttp.ClientSession, method: str, url: str | yarl.URL, **kwargs: Any
) -> tuple[int, str, str]:
    """(status, error name, message) of a request that must get the JSON error."""
    async with http.request(method, url, allow_redirects=False, **kwargs) as response:
        assert response.content_type == "application/json", await response.text()
        body = await response.json()
        assert response.headers["X-Segtxn-Error"] == body["error"]
        return response.status, body["error"], body["message"]
