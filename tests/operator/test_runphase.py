"""Where a VerificationRun is, from its driver pod and report (pure): the transition table
and what each pod state and verdict means."""

from __future__ import annotations

import json
from typing import Any

import pytest

from segtxn.operator.runphase import IllegalTransition, Phase, advance, observe, read_verdict


def pod(phase: str, inits: list[Any] | None = None, mains: list[Any] | None = None) -> Any:
    return {
        "status": {
            "phase": phase,
            "initContainerStatuses": inits or [],
            "containerStatuses": mains or [],
        }
    }


def report(**verdict: Any) -> Any:
    return {"data": {"verdict.json": json.dumps(verdict)}}


RUNNING: dict[str, Any] = {"state": {"running": {}}}


@pytest.mark.parametrize(
    ("current", "new"),
    [
        (Phase.SUCCEEDED, Phase.FAILED),
        (Phase.FAILED, Phase.SUCCEEDED),
        (Phase.SUCCEEDED, Phase.RUNNING),
        (Phase.RUNNING, Phase.PENDING),
    ],
)
def test_a_run_never_moves_back_or_out_of_a_verdict(current: Phase, new: Phase) -> None:
    with pytest.raises(IllegalTransition, match=f"from {current.value} to {new.value}"):
        advance(current, new)


def test_forward_moves_and_staying_put_are_allowed() -> None:
    assert advance(Phase.PENDING, Phase.RUNNING) is Phase.RUNNING
    assert advance(Phase.PENDING, Phase.FAILED) is Phase.FAILED  # failed before running
    assert advance(Phase.RUNNING, Phase.SUCCEEDED) is Phase.SUCCEEDED
    assert advance(Phase.FAILED, Phase.FAILED) is Phase.FAILED


def test_the_pod_says_where_the_run_is() -> None:
    assert observe(pod("Pending"), None).reason == "Starting"
    assert observe(pod("Pending", [{"name": "workload", **RUNNING}]), None).reason == "Workload"
    done = {"name": "workload", "state": {"terminated": {"exitCode": 0}}}
    starting = observe(pod("Pending", [done]), None)
    assert (starting.phase, starting.reason) == (Phase.RUNNING, "Checking")
    assert observe(pod("Running", [done], [{"name": "driver", **RUNNING}]), None).reason == (
        "Checking"
    )
    crashed = {"name": "driver", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}
    seen = observe(pod("Failed", [done], [crashed]), None)
    assert (seen.phase, seen.reason) == (Phase.FAILED, "CheckFailed")
    assert seen.message == "container driver exited 137: OOMKilled"
    assert observe(pod("Succeeded", [done]), None).reason == "NoVerdict"
    assert observe(None, None).reason == "DriverGone"


def test_a_verdict_decides_whatever_the_pod_does() -> None:
    passed = observe(pod("Running"), report(passed=True, anomalies=0, counts={}, drained=True))
    assert (passed.phase, passed.reason) == (Phase.SUCCEEDED, "Passed")
    assert passed.status()["verdict"] == "Passed"
    undrained = observe(None, report(passed=False, anomalies=0, counts={}, drained=False))
    assert (undrained.phase, undrained.reason) == (Phase.FAILED, "NotDrained")
    assert undrained.message == "0 anomalies (none); not every input was consumed"


def test_a_configmap_that_is_not_a_verdict_is_none() -> None:
    assert read_verdict({"data": {"verdict.json": "not json"}}) is None
    assert read_verdict({"data": {"verdict.json": "[1, 2]"}}) is None
    assert read_verdict({"data": {}}) is None
    assert read_verdict(None) is None
