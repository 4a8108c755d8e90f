"""Where a VerificationRun is, read from its driver pod and its report ConfigMap.

The operator cannot see into the run: it reads the driver pod's phase and container
states (:func:`observe`) and the verdict the checker writes into ``<run>-report``
(:mod:`segtxn.verify.publish`). A verdict decides the run whatever the pod is doing (the
driver is still stopping its executors when it has written it); without one, a pod that
ended means the run could not be checked, and the container that failed says why.

A run moves forward only (:data:`TRANSITIONS`): Pending, Running, then Succeeded or Failed
for good. Re-running is creating another VerificationRun: a finished run keeps its verdict
even if its pod or ConfigMap is deleted by hand.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MESSAGE_CHARS = 400
"""How much of a failed container's termination message (its log's tail) a status keeps."""


class Phase(enum.Enum):
    PENDING = "Pending"
    """The driver pod exists; nothing of the run has started (scheduling, image pull)."""
    RUNNING = "Running"
    """The workload or the check runs."""
    SUCCEEDED = "Succeeded"
    """The check ran and found no anomaly, every input consumed."""
    FAILED = "Failed"
    """The check found anomalies, or the run could not be checked (``reason`` says)."""

    @property
    def finished(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED)


TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.PENDING: frozenset({Phase.RUNNING, Phase.SUCCEEDED, Phase.FAILED}),
    Phase.RUNNING: frozenset({Phase.SUCCEEDED, Phase.FAILED}),
    Phase.SUCCEEDED: frozenset(),
    Phase.FAILED: frozenset(),
}


class IllegalTransition(Exception):
    """A run asked to move backwards or out of a finished phase."""


def advance(current: Phase, new: Phase) -> Phase:
    """``new`` when the table allows it; staying put is always allowed.

    Raises:
        IllegalTransition: any other move.
    """
    if new is current or new in TRANSITIONS[current]:
        return new
    raise IllegalTransition(f"a run cannot go from {current.value} to {new.value}")


@dataclass(frozen=True)
class Observation:
    """What the run's objects say: its phase, why, and its verdict's fields for status."""

    phase: Phase
    reason: str
    message: str
    verdict: Mapping[str, Any] = field(default_factory=dict)

    def status(self) -> dict[str, Any]:
        """The status fields this observation sets (phase, reason, message, verdict)."""
        found: dict[str, Any] = {
            "phase": self.phase.value,
            "reason": self.reason,
            "message": self.message,
        }
        if self.verdict:
            counts = {k: int(v) for k, v in self.verdict.get("counts", {}).items()}
            found |= {
                "verdict": "Passed" if self.verdict.get("passed") else "Failed",
                "anomalies": int(self.verdict.get("anomalies", sum(counts.values()))),
                "anomalyCounts": counts,
                "drained": bool(self.verdict.get("drained")),
            }
        return found


def read_verdict(config_map: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The verdict in the report ConfigMap; None when there is none (yet) or it is not the
    checker's JSON object (a ConfigMap by that name written by someone else)."""
    raw = (config_map or {}).get("data", {}).get("verdict.json")
    if raw is None:
        return None
    try:
        found = json.loads(raw)
    except json.JSONDecodeError:
        return None
    return found if isinstance(found, dict) and "passed" in found else None


def _terminated(statuses: list[Mapping[str, Any]] | None) -> Mapping[str, Any] | None:
    for status in statuses or ():
        state = status.get("state", {}).get("terminated")
        if state and state.get("exitCode", 0) != 0:
            return {"name": status.get("name", "?"), **state}
    return None


def _running(statuses: list[Mapping[str, Any]] | None) -> str | None:
    for status in statuses or ():
        if "running" in status.get("state", {}):
            return str(status.get("name", "?"))
    return None


def _done(statuses: list[Mapping[str, Any]] | None) -> bool:
    """Some container ended well: the workload is done, the check starting."""
    return any(
        s.get("state", {}).get("terminated", {}).get("exitCode", 1) == 0 for s in statuses or ()
    )


def _describe(verdict: Mapping[str, Any]) -> str:
    counts = {k: v for k, v in verdict.get("counts", {}).items() if v}
    if verdict.get("passed"):
        return "no anomaly; every input consumed"
    found = ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items()))
    drained = "" if verdict.get("drained") else "; not every input was consumed"
    return f"{verdict.get('anomalies', 0)} anomalies ({found or 'none'}){drained}"


def observe(pod: Mapping[str, Any] | None, report: Mapping[str, Any] | None) -> Observation:
    """The run's state from its driver pod (None: gone) and its report ConfigMap (None:
    not written yet)."""
    verdict = read_verdict(report)
    if verdict is not None:
        if verdict.get("passed"):
            return Observation(Phase.SUCCEEDED, "Passed", _describe(verdict), verdict)
        why = "AnomaliesFound" if verdict.get("anomalies") else "NotDrained"
        return Observation(Phase.FAILED, why, _describe(verdict), verdict)
    if pod is None:
        return Observation(Phase.FAILED, "DriverGone", "the driver pod is gone, no verdict")
    status = pod.get("status", {})
    phase = status.get("phase", "Pending")
    inits, mains = status.get("initContainerStatuses"), status.get("containerStatuses")
    if phase in ("Failed", "Succeeded"):
        failed = _terminated(inits) or _terminated(mains)
        if failed is None:
            return Observation(Phase.FAILED, "NoVerdict", "the driver ended without a verdict")
        why = "WorkloadFailed" if failed["name"] == "workload" else "CheckFailed"
        tail = str(failed.get("message") or failed.get("reason") or "").strip()
        message = f"container {failed['name']} exited {failed.get('exitCode')}"
        if tail:
            message += f": {tail[-MESSAGE_CHARS:]}"
        return Observation(Phase.FAILED, why, message)
    running = _running(mains) or _running(inits)
    if running == "workload":
        return Observation(Phase.RUNNING, "Workload", "the workload runs")
    if running is not None or _done(inits):
        return Observation(Phase.RUNNING, "Checking", "the Spark check runs")
    return Observation(Phase.PENDING, "Starting", f"driver pod {phase}")
