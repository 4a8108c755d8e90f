"""The fuzzing tally: cases tried and distinct violations per class, printed at the end of a
run (and written to ``SEGTXN_FUZZ_SURVEY``'s file when surveying).

It is a plugin of the whole suite (``tests/conftest.py`` lists it) rather than part of
``tests/fuzz/conftest.py`` because under pytest-xdist the tests run in worker processes
while the summary is printed by the controller, which never loads that folder's conftest:
each worker hands its tally over when it ends (``workeroutput``), and the controller adds
them up before it prints.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest

SURVEY = os.environ.get("SEGTXN_FUZZ_SURVEY")
_WORKER_KEY = "segtxn_fuzz_tally"


@dataclass
class Tally:
    """Cases tried and distinct violations, per class (endpoint group or frame type)."""

    tried: Counter[str] = field(default_factory=Counter)
    violations: dict[str, dict[str, str]] = field(default_factory=dict)
    """class -> {signature: an example}."""

    def violation(self, kind: str, signature: str, example: str) -> None:
        """Record a violation; outside a survey, fail the case (hypothesis shrinks it)."""
        self.violations.setdefault(kind, {}).setdefault(signature, example[:3000])
        if not SURVEY:
            raise AssertionError(f"[{kind}] {signature}\n{example[:2000]}")

    def add(self, other: dict[str, Any]) -> None:
        """Add a worker's tally, as :meth:`as_json` gave it."""
        self.tried.update(other["tried"])
        for kind, found in other["violations"].items():
            mine = self.violations.setdefault(kind, {})
            for signature, example in found.items():
                mine.setdefault(signature, example)

    def as_json(self) -> str:
        return json.dumps({"tried": self.tried, "violations": self.violations})


TALLY = Tally()


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller prints
        workeroutput[_WORKER_KEY] = TALLY.as_json()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist's controller: a worker ended; add its tally."""
    found = getattr(node, "workeroutput", {}).get(_WORKER_KEY)
    if found:
        TALLY.add(json.loads(found))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not TALLY.tried:
        return
    write = terminalreporter.write_line
    terminalreporter.section("fuzzing: cases tried per class")
    for kind in sorted(TALLY.tried):
        found = len(TALLY.violations.get(kind, {}))
        write(f"{kind:32} {TALLY.tried[kind]:7} cases  {found:3} distinct violations")
    if SURVEY:
        with open(SURVEY, "w") as out:
            json.dump({"tried": TALLY.tried, "violations": TALLY.violations}, out, indent=2)
        write(f"violations written to {SURVEY}")
