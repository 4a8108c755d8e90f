"""What a roll of the brokers keeps and reads, apart from the Kubernetes and admin calls
that drive it (:mod:`.rolling`): the settings that bound each step, the steps and their one
transition table, the record kept in ``status.roll``, and a broker's pod as the roll reads it.

Contract: pure values, no I/O. :meth:`Record.to` is the only way a record changes step and
raises :class:`IllegalStep` for a transition :data:`NEXT` does not allow; :meth:`Record.parse`
and :meth:`Pod.parse` never raise (a ``status.roll`` that is not a record reads as None: the
roll then picks its broker from the pods again). :class:`RollSettings` lives here so that the
operator's flags and runtime (:mod:`.runtime`) configure a roll without importing the code
that runs one.

Apart from :mod:`.rolling` because it is the roll's state, not the I/O of its steps: what a
restarted operator resumes from, and pure: reading or stepping it needs no cluster or broker.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

REVISION_LABEL = "controller-revision-hash"
"""The label a StatefulSet's controller sets on each pod: the revision it was made from."""


@dataclass(frozen=True)
class RollSettings:
    """How long each step of a roll may take, and when a stalled roll is tried again."""

    drain_timeout_s: float = 300.0
    """From a broker's first drain request until it must hold no topic or segment."""
    evict_timeout_s: float = 300.0
    """From the first refused eviction of a broker's pod (a PodDisruptionBudget that does
    not allow it now) until it must have been evicted."""
    ready_timeout_s: float = 600.0
    """From evicting a broker's pod until its successor must be Ready (the brokers'
    startup probe alone allows 120 s)."""
    retry_s: float = 300.0
    """How long a stalled roll waits before it is tried again (a new spec retries at
    once)."""


class Step(enum.Enum):
    """Where the broker in progress is."""

    DRAINING = "Draining"
    EVICTING = "Evicting"
    """Its eviction was refused (a budget); tried again each tick."""
    REPLACING = "Replacing"
    STALLED = "Stalled"


NEXT: dict[Step, frozenset[Step]] = {
    Step.DRAINING: frozenset({Step.EVICTING, Step.REPLACING, Step.STALLED}),
    Step.EVICTING: frozenset({Step.REPLACING, Step.STALLED}),
    # done: the record goes; an old pod there again: evicted again
    Step.REPLACING: frozenset({Step.EVICTING, Step.STALLED}),
    Step.STALLED: frozenset({Step.DRAINING, Step.EVICTING, Step.REPLACING}),  # retried
}
"""The one transition table; a broker that is done leaves no record."""


class IllegalStep(Exception):
    """A transition :data:`NEXT` does not allow (a bug, never a cluster's state)."""


@dataclass(frozen=True)
class Record:
    """``status.roll``: the broker in progress and its step."""

    revision: str
    """The update revision it is being rolled to."""
    broker: str
    step: Step
    since: str
    """When the step began (timeouts count from here), or, stalled, when it is retried."""
    note: str = ""
    """The last trouble met (a drain's failures), said in the condition."""

    def to(self, step: Step, since: str, note: str = "") -> Record:
        if step not in NEXT[self.step]:
            raise IllegalStep(f"{self.broker}: {self.step.value} -> {step.value}")
        return replace(self, step=step, since=since, note=note)

    def body(self) -> dict[str, str]:
        return {
            "revision": self.revision,
            "broker": self.broker,
            "step": self.step.value,
            "since": self.since,
            "note": self.note,
        }

    @staticmethod
    def parse(raw: Mapping[str, Any] | None) -> Record | None:
        """The record in ``status.roll``; None when absent or not one (then the roll picks
        its broker from the pods again)."""
        try:
            if not raw:
                return None
            return Record(
                str(raw["revision"]),
                str(raw["broker"]),
                Step(raw["step"]),
                str(raw["since"]),
                str(raw.get("note") or ""),
            )
        except (KeyError, ValueError, TypeError):
            return None


@dataclass(frozen=True)
class Pod:
    """What a roll reads of a broker's pod."""

    name: str
    uid: str
    revision: str | None
    ready: bool
    terminating: bool

    @staticmethod
    def parse(raw: Mapping[str, Any]) -> Pod:
        meta = raw.get("metadata") or {}
        conditions = (raw.get("status") or {}).get("conditions") or []
        return Pod(
            str(meta.get("name")),
            str(meta.get("uid")),
            (meta.get("labels") or {}).get(REVISION_LABEL),
            any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions),
            bool(meta.get("deletionTimestamp")),
        )
