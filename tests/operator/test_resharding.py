"""A long resharding says where it is at each step: condition ``Resharding`` ``step k of
n`` written to the status subresource before each split or merge, not only at the end (Kopf
against kmock, a real broker on a real etcd)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.operator.emulator import Emulator, emulator, operator
from tests.operator.support import WAIT_S, Local, cluster, status
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)
TOPIC = {"clusterRef": "demo", "tenant": "acme", "namespace": "shop", "topic": "orders"}


def resharding(conditions: list[dict[str, Any]]) -> dict[str, Any]:
    found = [c for c in conditions if c["type"] == "Resharding"]
    return found[0] if found else {}


def written_by(emu: Emulator, name: str) -> list[dict[str, Any]]:
    """The Resharding condition of each status write of ``name`` that carried one. Only
    those: on a loaded machine another object's status (the cluster's), or another of the
    topic's conditions, may be written between a reset of the record and the resharding's
    first write (a merge's first write seen was once not a Resharding one: KeyError
    'reason')."""
    assert emu.status_patches is not None, "status writes are not being recorded"
    found = [
        resharding(body["status"]["conditions"])
        for written, body in emu.status_patches
        if written == name and "conditions" in body.get("status", {})
    ]
    return [c for c in found if c]


async def test_each_step_of_a_resharding_is_in_status_while_it_runs(shared_local: Local) -> None:
    async with emulator() as emu, operator(emu, shared_local.memo()):
        await cluster(emu, shared_local)
        await emu.create("ScalableTopic", "orders", {**TOPIC, "initialSegments": 1})
        await wait_until(lambda: status(emu, "ScalableTopic", "orders").get("activeSegments")
                         == 1, timeout=WAIT_S, what="the topic created")  # fmt: skip
        emu.status_patches = []
        await emu.patch("ScalableTopic", "orders", {"spec": {"targetSegments": 4}})
        await wait_until(lambda: status(emu, "ScalableTopic", "orders").get("activeSegments")
                         == 4, timeout=WAIT_S, what="split to 4")  # fmt: skip

        written = written_by(emu, "orders")
        steps = [(c["status"], c["reason"], c["message"]) for c in written]
        # One write per step, before it is made (the widest segment each time: 0, then
        # its lower half 1, then 2), then the handler's own at the end.
        assert steps == [
            ("True", "Splitting", "step 1 of 3: splitting segment 0"),
            ("True", "Splitting", "step 2 of 3: splitting segment 1"),
            ("True", "Splitting", "step 3 of 3: splitting segment 2"),
            ("False", "Converged", "3 of 3 steps made; 4 active segments"),
        ]
        for c in written:
            assert c["observedGeneration"] == 2 and c["lastTransitionTime"]
        final = resharding(status(emu, "ScalableTopic", "orders")["conditions"])
        assert (final["status"], final["reason"]) == ("False", "Converged")

        emu.status_patches = []
        await emu.patch("ScalableTopic", "orders", {"spec": {"targetSegments": 3}})
        await wait_until(lambda: status(emu, "ScalableTopic", "orders").get("activeSegments")
                         == 3, timeout=WAIT_S, what="merged to 3")  # fmt: skip
        merges = written_by(emu, "orders")
        assert merges[0]["reason"] == "Merging"
        assert merges[0]["message"].startswith("step 1 of 1: merging segments ")
        assert merges[0]["observedGeneration"] == 3
