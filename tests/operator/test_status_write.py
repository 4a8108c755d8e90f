"""How a status writer's patch function treats what is already in the body and what an
earlier write left pending (:mod:`segtxn.operator.applying`)."""

from __future__ import annotations

from typing import Any, cast

import kopf

from segtxn.operator.applying import StatusWrite, forget_status_writes, write_status

HANDLER = ("Applied",)
TIMER = ("Ready", "Rolling", "Degraded")


def cond(kind: str, value: str) -> dict[str, Any]:
    return {"type": kind, "status": value, "reason": "R", "message": "m"}


def stored() -> dict[str, Any]:
    return {
        "metadata": {"resourceVersion": "7"},
        "status": {
            "phase": "Ready",
            "roll": {"broker": 1},
            "conditions": [cond("Applied", "True"), cond("Ready", "True")],
        },
    }


def applied(patch: kopf.Patch, body: dict[str, Any]) -> dict[str, Any]:
    raw = cast(kopf.RawBody, body)
    for fn in patch.fns:
        fn(raw)
    return body


def writes(patch: kopf.Patch) -> list[StatusWrite]:
    return [fn for fn in patch.fns if isinstance(fn, StatusWrite)]


def test_a_write_sets_its_own_conditions_and_fields_and_leaves_the_others() -> None:
    patch = kopf.Patch()
    write_status(
        patch,
        [cond("Applied", "False"), cond("Ready", "False")],  # Ready is not the handler's
        own=HANDLER,
        fields={"observedGeneration": 2, "roll": None},
    )
    status = applied(patch, stored())["status"]
    assert status["conditions"] == [cond("Applied", "False"), cond("Ready", "True")]
    assert status["observedGeneration"] == 2
    assert "roll" not in status  # None removes it, as a merge patch does
    assert status["phase"] == "Ready"


def test_a_newer_write_replaces_a_pending_one_and_keeps_the_fields_it_does_not_set() -> None:
    """A handler's write carried over by Kopf (it met a newer version), then the next run
    refuses a newer spec: the refusal's ``Applied`` wins, and the children applied for
    generation 3 are still said (``observedGeneration``)."""
    patch = kopf.Patch()
    write_status(patch, [cond("Applied", "True")], own=HANDLER, fields={"observedGeneration": 3})
    carried = kopf.Patch(kopf.Patch(fns=patch.fns))  # what Kopf does with a remaining patch
    write_status(carried, [cond("Applied", "False")], own=HANDLER)
    assert len(writes(carried)) == 1
    status = applied(carried, stored())["status"]
    assert status["observedGeneration"] == 3
    assert [c["status"] for c in status["conditions"]] == ["False", "True"]


def test_a_ticks_start_forgets_an_earlier_ticks_pending_write_and_nothing_else() -> None:
    """A timer's write that met a newer version is carried into its next tick; a tick that
    finds nothing to change wrote that older tick's values over the current status."""
    patch = kopf.Patch()
    write_status(
        patch, [cond("Ready", "False")], own=TIMER, fields={"phase": "Updating", "roll": {}}
    )
    write_status(patch, [cond("Applied", "False")], own=HANDLER)
    finalizer = kopf.Patch(fns=[lambda body: None]).fns[0]
    patch.fns.append(finalizer)
    carried = kopf.Patch(kopf.Patch(fns=patch.fns))
    forgotten = forget_status_writes(carried, TIMER)
    assert [w.own for w in forgotten] == [frozenset(TIMER)]
    assert [w.own for w in writes(carried)] == [frozenset(HANDLER)]
    assert finalizer in carried.fns
    status = applied(carried, stored())["status"]
    assert status["phase"] == "Ready" and status["roll"] == {"broker": 1}
