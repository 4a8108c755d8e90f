"""The operator while Kopf stops it: a timer or daemon Kopf has just stopped is not
started again (segtxn/operator/runtime.py, :func:`track`, says why). Every test that runs
the operator stops it within a bound (tests/operator/emulator.py, STOP_S); this checks the
rule itself, with the stop flags Kopf hands its daemons."""

from __future__ import annotations

from typing import cast

import aiohttp
import kopf
from kopf._core.intents.stoppers import DaemonStopper  # what Kopf makes each daemon's flag of

from segtxn.operator.kube import Kube
from segtxn.operator.runtime import OperatorConfig, Runtime, serving, track

Reason = kopf.DaemonStoppingReason


def runtime() -> Runtime:
    # No call is made: the clients are never used here.
    return Runtime(OperatorConfig(), cast(Kube, None), cast(aiohttp.ClientSession, None))


async def test_timers_are_not_started_again_once_kopf_stops_the_operator() -> None:
    memo = kopf.Memo(runtime=runtime())
    readiness, deleted, status = DaemonStopper(), DaemonStopper(), DaemonStopper()
    assert serving(memo) and not track(memo, readiness.async_waiter)
    assert not track(memo, deleted.async_waiter)
    deleted.set(Reason.RESOURCE_DELETED)  # one object's timer stopped: the others go on
    assert serving(memo) and not track(memo, status.async_waiter)
    readiness.set(Reason.OPERATOR_EXITING)  # what Kopf's stop does first, to each daemon
    assert not serving(memo)
    assert track(memo, DaemonStopper().async_waiter)  # a daemon started anyway returns


async def test_before_start_up_everything_runs_and_after_clean_up_nothing() -> None:
    starting = kopf.Memo()
    assert serving(starting) and not track(starting, DaemonStopper().async_waiter)
    memo = kopf.Memo(runtime=runtime())
    memo["runtime"].closed = True
    assert not serving(memo) and track(memo, DaemonStopper().async_waiter)
