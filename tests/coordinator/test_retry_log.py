"""A coordinator loop's failures in a row are logged sparingly (segtxn/coordinator/retry.py):
the first at WARNING (a bug's at ERROR), then at most one a ``warn_every_s`` (or at once
when the failure changes kind), the others at DEBUG; one INFO line when the loop's step
goes through after failures.

Every try was a WARNING: a participant's lasting failure gave one every ~2 s per stuck
transaction, so many transactions stuck on one damaged cursor flooded the log. The clock
is :class:`Retry`'s own, injected: time is the subject here."""

from __future__ import annotations

import logging

import pytest

from segtxn.coordinator.retry import Retry
from segtxn.metastore import MetadataStoreError
from segtxn.protocol.errors import ErrorName, ServerError

WHAT = "txn 0:7: finishing its COMMIT"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def records(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "segtxn.coordinator.retry" and r.levelno == level
    ]


def refused() -> ServerError:
    return ServerError(ErrorName.PERSISTENCE, "the cursor record does not read")


def test_a_lasting_failure_warns_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="segtxn.coordinator.retry")
    clock = Clock()
    retry = Retry(WHAT, 0.05, expected_max_s=2.0, warn_every_s=60.0, clock=clock)
    for _ in range(30):  # a minute of tries, 2 s apart
        retry.pause_after(refused())
        clock.now += 2.0 - 1e-6
    assert len(records(caplog, logging.WARNING)) == 1
    assert "(1 in a row)" in records(caplog, logging.WARNING)[0]
    assert len(records(caplog, logging.DEBUG)) == 29
    clock.now += 1.0  # a minute since the first WARNING
    retry.pause_after(refused())
    warnings = records(caplog, logging.WARNING)
    assert len(warnings) == 2 and "(31 in a row)" in warnings[1], warnings
    retry.reset()  # it went through
    (done,) = records(caplog, logging.INFO)
    assert done.startswith(WHAT) and "31 failures" in done, done


def test_a_failure_of_another_kind_warns_at_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="segtxn.coordinator.retry")
    clock = Clock()
    retry = Retry(WHAT, 0.05, expected_max_s=2.0, clock=clock)
    for e in (refused(), refused(), MetadataStoreError("store away"), refused()):
        retry.pause_after(e)
        clock.now += 1.0
    warnings = records(caplog, logging.WARNING)
    assert [w.split(": ")[2] for w in warnings] == [
        "ServerError",
        "MetadataStoreError",
        "ServerError",
    ], warnings
    assert len(records(caplog, logging.DEBUG)) == 1


def test_a_bugs_error_is_rate_limited_too_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="segtxn.coordinator.retry")
    clock = Clock()
    retry = Retry(WHAT, 1.0, clock=clock)
    for _ in range(5):
        retry.pause_after(RuntimeError("a bug"))
        clock.now += 10.0
    errors = [
        r
        for r in caplog.records
        if r.name == "segtxn.coordinator.retry" and r.levelno >= logging.ERROR
    ]
    assert len(errors) == 1 and errors[0].exc_info is not None
    assert len(records(caplog, logging.DEBUG)) == 4


def test_a_success_without_failures_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="segtxn.coordinator.retry")
    retry = Retry(WHAT, 1.0)
    retry.reset()
    assert not [r for r in caplog.records if r.name == "segtxn.coordinator.retry"]
    retry.pause_after(refused())
    retry.reset()
    retry.reset()
    assert len(records(caplog, logging.INFO)) == 1
