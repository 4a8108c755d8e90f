"""A coordinator's answers held on their way back to the client, for tests that make
something happen between a call's landing and the client taking its answer in."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from segtxn.client.coordinators import Coordinators


@dataclass
class HeldAnswers:
    answered: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once a held call was answered (the coordinator did what it asked)."""
    go_on: asyncio.Event = field(default_factory=asyncio.Event)
    """Set it to let the held answers reach the client."""


def hold_answers(monkeypatch: pytest.MonkeyPatch, path_suffix: str) -> HeldAnswers:
    """From now on, every coordinator call whose path ends with ``path_suffix`` (e.g.
    ``/subscriptions``: a v4 ADD_SUBSCRIPTION) is made, and its answer held until
    ``go_on`` is set."""
    held = HeldAnswers()
    call = Coordinators.call

    async def answer_held(self: Coordinators, method: str, path: str, **kwargs: Any) -> Any:
        reply = await call(self, method, path, **kwargs)
        if path.endswith(path_suffix):
            held.answered.set()
            await held.go_on.wait()
        return reply

    monkeypatch.setattr(Coordinators, "call", answer_held)
    return held
