"""A ledger's error is answered by one rule on every edge of a server: an HTTP request's
answer (the error boundary, segtxn/boundary.py), a WebSocket closed after its upgrade, and
the ``Error`` frame a broker's socket answers a frame with (segtxn/broker/sockets.py).

A retriable ``LedgerError`` (too few replicas, a full disk, a write that met another owner's
fence, a cursor's save that did) is ``ServiceNotReady``, logged at WARNING without a
traceback; damaged data is ``PersistenceError`` naming it; only what is neither is a bug
(``UnknownError`` and an incident). The frame path had its own rule, which knew the store's
and the peers' trouble but not a ledger's: a frame that met a retriable ledger error was
answered ``UnknownError`` with an incident (fatal to the client) where the same failure of
an HTTP call was answered ``ServiceNotReady``. So was a WebSocket closed after its upgrade
(1011, internal error, instead of 1013, try again later).

Real aiohttp servers with the boundary installed; the frame path's answer is the function
every broker socket answers with.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
from aiohttp import web

from segtxn.boundary import install
from segtxn.broker.sockets import failure_frame
from segtxn.ledger.errors import (
    CursorDamaged,
    LedgerError,
    LedgerFenced,
    LedgerSealed,
    NotEnoughReplicas,
    StorageFull,
    WriteFailed,
)
from segtxn.ledger.fencing import OwnerChanged
from segtxn.protocol.errors import ErrorName
from segtxn.web import AppServer, Listener
from tests.test_boundary import closed_with, failing, failing_after_upgrade, get

FAILURES: dict[str, tuple[Callable[[], LedgerError], ErrorName]] = {
    "too-few-replicas": (
        lambda: NotEnoughReplicas("2 of 3 replicas answered"),
        ErrorName.SERVICE_NOT_READY,
    ),
    "disk-full": (lambda: StorageFull("No space left on device"), ErrorName.SERVICE_NOT_READY),
    "owner-changed": (
        lambda: OwnerChanged("cursor s of L: not saved: another owner opened the ledger"),
        ErrorName.SERVICE_NOT_READY,
    ),
    "write-fenced": (
        lambda: WriteFailed("write failed", LedgerFenced("changed by another owner")),
        ErrorName.SERVICE_NOT_READY,
    ),
    "cursor-damaged": (
        lambda: CursorDamaged("L", "s", "/managed-cursors/L/s", "not JSON"),
        ErrorName.PERSISTENCE,
    ),
    "sealed": (lambda: LedgerSealed("a bug: nothing named it"), ErrorName.UNKNOWN),
}
"""Each failure (made afresh for each raise), and the name every edge answers it with."""


@pytest.fixture
async def server() -> AsyncIterator[str]:
    app = web.Application()
    install(app)
    for kind, (make, _) in FAILURES.items():
        app.router.add_get(f"/http/{kind}", failing(make()))
        app.router.add_get(f"/ws/{kind}", failing_after_upgrade(make()))
    listener = Listener("127.0.0.1")  # its port, held from the pick on
    running = AppServer(app, f"http://127.0.0.1:{listener.port}", None, None, listener=listener)
    await running.start()
    try:
        yield f"http://127.0.0.1:{listener.port}"
    finally:
        await running.stop()


def incidents(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The incidents logged (each at ERROR, with its traceback)."""
    return [r.getMessage() for r in caplog.records if r.exc_info and "incident" in r.getMessage()]


@pytest.mark.parametrize("kind", list(FAILURES))
async def test_a_ledger_error_is_answered_by_the_same_name_over_http_and_websocket(
    server: str, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    make, name = FAILURES[kind]
    error = make()
    with caplog.at_level(logging.INFO):
        _, headers, _ = await get(f"{server}/http/{kind}")
        frame = failure_frame("an ack frame", error, request_id=7)
        code, reason = await closed_with(f"{server}/ws/{kind}")
    assert headers["X-Segtxn-Error"] == name, (kind, headers)
    assert (frame.error, frame.request_id) == (name, 7), frame
    assert reason.startswith(f"{name.value}: "), reason
    if name is ErrorName.UNKNOWN:  # a bug: an incident each, with its traceback
        assert code == aiohttp.WSCloseCode.INTERNAL_ERROR, reason
        assert len(incidents(caplog)) == 3, incidents(caplog)
        return
    # named: its message says it (the path, the system's words, the repair), no incident
    assert str(error) in frame.message, frame.message
    assert not incidents(caplog), incidents(caplog)
    assert not [r for r in caplog.records if r.exc_info], "a traceback for a known failure"
    if name is ErrorName.SERVICE_NOT_READY:
        assert code == aiohttp.WSCloseCode.TRY_AGAIN_LATER, reason
        warned = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == 3 and all(str(error) in r.getMessage() for r in warned), warned
