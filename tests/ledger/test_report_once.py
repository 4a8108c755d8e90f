"""``report_once``: a damaged or foreign file's refusal at ERROR once, at DEBUG after, and a
bounded memory of what it said. It kept every message for the life of the process: a
broker meeting ever new damaged files (or messages naming ever new positions) grew without
end. It now remembers the most recently said ``REPORTED_LIMIT`` messages."""

from __future__ import annotations

import logging
import uuid

import pytest

from segtxn.ledger import errors
from segtxn.ledger.errors import REPORTED_LIMIT, LedgerCorrupted, report_once

log = logging.getLogger("tests.report_once")


def _say(message: str) -> None:
    report_once(log, LedgerCorrupted(message), "refused: %s", message)


def _levels(caplog: pytest.LogCaptureFixture, message: str) -> list[int]:
    return [r.levelno for r in caplog.records if r.getMessage().startswith(f"refused: {message}")]


def test_a_refusal_is_said_at_error_once_then_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    message = f"damaged-{uuid.uuid4().hex}"
    with caplog.at_level(logging.DEBUG, logger=log.name):
        for _ in range(3):
            _say(message)
    assert _levels(caplog, message) == [logging.ERROR, logging.DEBUG, logging.DEBUG]


def test_what_it_remembers_is_bounded_the_least_recently_said_forgotten(
    caplog: pytest.LogCaptureFixture,
) -> None:
    run = uuid.uuid4().hex
    kept, dropped = f"kept-{run}", f"dropped-{run}"
    with caplog.at_level(logging.DEBUG, logger=log.name):
        _say(dropped)
        _say(kept)
        for n in range(REPORTED_LIMIT - 2):
            _say(f"other-{run}-{n}")
        _say(kept)  # said again: the most recent now
        for n in range(REPORTED_LIMIT - 2, REPORTED_LIMIT):
            _say(f"other-{run}-{n}")  # two more: the two least recent go, ``dropped`` first
        assert len(errors._REPORTED) == REPORTED_LIMIT
        caplog.clear()
        _say(kept)
        _say(dropped)
    assert _levels(caplog, kept) == [logging.DEBUG]
    assert _levels(caplog, dropped) == [logging.ERROR]  # forgotten: said again, once
