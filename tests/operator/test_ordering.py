"""An upgrade's order: the brokers first, one at a time, then the coordinators, one
TransactionCoordinator at a time, each Deployment rolled before the next is applied (Kopf
against kmock; the brokers' admin endpoints faked, tests/operator/fakebrokers.py; the test
plays the StatefulSet's and the Deployments' controllers: the generation the API server
would bump, the status their controllers would write).

Before this, one cluster change applied the brokers and every coordinator Deployment at
once (both rolled together); these tests fail on that code at the first assertion that a
coordinator Deployment still runs the old image while the brokers roll."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import kmock
import pytest

from tests.operator.emulator import NS, Emulator, emulator, operator
from tests.operator.fakebrokers import FakeBrokers, serving
from tests.operator.support import WAIT_S, status
from tests.operator.test_rolling import (
    BROKERS,
    change_image,
    cond,
    fake_brokers,
    memo,
    replaced,
    running,
    watch,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(150)
DEPLOYMENTS = "apps/v1/deployments"


def image(emu: Emulator, coordinator: str) -> str | None:
    found = emu.get(DEPLOYMENTS, f"{coordinator}-coordinator")
    return (
        None if found is None else str(found["spec"]["template"]["spec"]["containers"][0]["image"])
    )


def args(emu: Emulator, coordinator: str) -> list[str]:
    found = emu.get(DEPLOYMENTS, f"{coordinator}-coordinator")
    assert found is not None
    return list(found["spec"]["template"]["spec"]["containers"][0]["args"])


async def controller(
    emu: Emulator, plural: str, name: str, *, generation: int, observed: int, updated: int,
    ready: int, replicas: int,
) -> None:  # fmt: skip
    """What the workload's controller would write into its status, once the API server
    has its spec at ``generation`` (the emulator bumps it with each apply that changes
    the spec: one apply per template here)."""
    path = f"/apis/apps/v1/namespaces/{NS}/{plural}/{name}"
    found = emu.get(f"apps/v1/{plural}", name)
    assert found is not None and found["metadata"].get("generation") == generation, found
    state = {"observedGeneration": observed, "replicas": replicas, "updatedReplicas": updated,
             "readyReplicas": ready}  # fmt: skip
    code, body = await emu.call("PATCH", f"{path}/status", {"status": state})
    assert code == 200, body


async def brokers_done(emu: Emulator, generation: int) -> None:
    await controller(emu, "statefulsets", "demo-broker", generation=generation,
                     observed=generation, updated=3, ready=3, replicas=3)  # fmt: skip


async def coordinators_done(emu: Emulator, coordinator: str, generation: int) -> None:
    await controller(emu, "deployments", f"{coordinator}-coordinator", generation=generation,
                     observed=generation, updated=2, ready=2, replicas=2)  # fmt: skip


async def two_coordinators(emu: Emulator) -> None:
    """TransactionCoordinators alpha and beta of cluster demo, their Deployments rolled."""
    for name in ("alpha", "beta"):
        await emu.create("TransactionCoordinator", name, {"clusterRef": "demo", "replicas": 2})
    await wait_until(lambda: image(emu, "alpha") == image(emu, "beta") == "segtxn:0.1.0",
                     timeout=WAIT_S, what="the coordinators rendered")  # fmt: skip
    for name in ("alpha", "beta"):
        await coordinators_done(emu, name, 1)


async def cluster_with_two_coordinators(emu: Emulator) -> None:
    """Cluster demo running (replication 3/2, its brokers rolled), then :func:`two_coordinators`."""
    await running(emu, replication="3/2")
    await brokers_done(emu, 1)
    await two_coordinators(emu)


async def brokers_replaced_before_any_coordinator(emu: Emulator, fake: FakeBrokers) -> None:
    """Each broker replaced on r2, highest first (:func:`replaced`), both coordinators still
    on the old image before each: the brokers roll first."""
    for k, name in enumerate(reversed(BROKERS), start=1):
        assert image(emu, "alpha") == image(emu, "beta") == "segtxn:0.1.0", name
        await replaced(emu, fake, k, name, "r2")


def rolling(emu: Emulator) -> dict[str, Any]:
    return cond(emu, "Rolling")


def hold_first(
    emu: Emulator, matches: Callable[[kmock.Request], bool]
) -> tuple[asyncio.Event, asyncio.Event]:
    """(held, release): the operator's first request from now on that ``matches`` waits,
    once ``held`` is set, until the test sets ``release``."""
    held, release = asyncio.Event(), asyncio.Event()

    async def gate(request: kmock.Request) -> None:
        if matches(request) and not held.is_set():
            held.set()
            await release.wait()

    emu.gate = gate
    return held, release


def hold_once(emu: Emulator, plural: str, name: str) -> tuple[asyncio.Event, asyncio.Event]:
    """:func:`hold_first` for the operator's first read of ``plural``/``name``."""

    def read(request: kmock.Request) -> bool:
        target = request.resource
        ours = target is not None and target.plural == plural and request.name == name
        return ours and request.action == kmock.action.FETCH

    return hold_first(emu, read)


async def test_an_image_change_rolls_the_brokers_then_each_coordinator_in_turn() -> None:
    fake = fake_brokers()
    async with serving(fake), emulator() as emu:
        breaches = watch(emu, fake)
        async with operator(emu, memo(fake)):
            await cluster_with_two_coordinators(emu)
            await change_image(emu, "segtxn:0.2.0", "r2")
            await controller(emu, "statefulsets", "demo-broker", generation=2, observed=2,
                             updated=0, ready=3, replicas=3)  # fmt: skip
            # A coordinator's own change mid-roll waits too: it would bring the new image.
            await emu.patch("TransactionCoordinator", "beta", {"spec": {"gcSweepSeconds": 5}})
            await wait_until(
                lambda: any(c["type"] == "Applied" and c["reason"] == "WaitingForRoll"
                            for c in status(emu, "TransactionCoordinator", "beta")
                            .get("conditions", [])),
                timeout=WAIT_S, what="beta waiting for the brokers",
            )  # fmt: skip
            await brokers_replaced_before_any_coordinator(emu, fake)
            await wait_until(lambda: rolling(emu).get("reason") == "UpToDate", timeout=WAIT_S,
                             what="every broker on r2")  # fmt: skip
            # Every pod runs r2, but the controller has not said so: still the brokers' turn.
            assert image(emu, "alpha") == image(emu, "beta") == "segtxn:0.1.0"
            await brokers_done(emu, 2)

            await wait_until(lambda: image(emu, "alpha") == "segtxn:0.2.0", timeout=WAIT_S,
                             what="alpha applied")  # fmt: skip
            assert image(emu, "beta") == "segtxn:0.1.0"  # one at a time
            await wait_until(lambda: rolling(emu).get("reason") == "Coordinators",
                             timeout=WAIT_S, what="the coordinators' turn said")  # fmt: skip
            assert rolling(emu)["status"] == "True"
            assert rolling(emu)["message"].startswith("TransactionCoordinator alpha (1 of 2)")
            # The Deployment's controller rolls alpha: seen, one pod updated, both.
            await controller(emu, "deployments", "alpha-coordinator", generation=2,
                             observed=2, updated=1, ready=2, replicas=3)  # fmt: skip
            await wait_until(lambda: "1/2 pods updated" in rolling(emu).get("message", ""),
                             timeout=WAIT_S, what="alpha's progress")  # fmt: skip
            assert image(emu, "beta") == "segtxn:0.1.0"
            await coordinators_done(emu, "alpha", 2)

            await wait_until(lambda: image(emu, "beta") == "segtxn:0.2.0", timeout=WAIT_S,
                             what="beta applied, after alpha")  # fmt: skip
            assert "--gc-sweep=5" in args(emu, "beta")  # its own change, in its turn
            await wait_until(
                lambda: rolling(emu).get("message", "").startswith(
                    "TransactionCoordinator beta (2 of 2)"),
                timeout=WAIT_S, what="beta's turn said",
            )  # fmt: skip
            await coordinators_done(emu, "beta", 2)
            await wait_until(lambda: rolling(emu).get("reason") == "UpToDate", timeout=WAIT_S,
                             what="the whole roll done")  # fmt: skip
            await wait_until(
                lambda: any(c["type"] == "Applied" and c["status"] == "True"
                            for c in status(emu, "TransactionCoordinator", "beta")
                            .get("conditions", [])),
                timeout=WAIT_S, what="beta Applied again",
            )  # fmt: skip
        assert breaches == []
        reasons = [(r, m) for _, r, m in emu.events("alpha")]
        assert ("Applied", "4 objects re-rendered for SegtxnCluster demo's spec") in reasons


async def test_an_image_changed_during_a_coordinators_tick_still_waits_for_the_brokers() -> None:
    """Kopf hands a timer a live body: what it reads after an await is the object as it is
    now. The cluster's tick found the brokers running the spec it began with, and then
    rendered the coordinators from the spec changed meanwhile and applied them, before a
    single broker rolled. Here that tick is held at its read of TransactionCoordinator
    alpha, in the coordinators' turn, while the image changes."""
    fake = fake_brokers()
    async with serving(fake), emulator() as emu:
        breaches = watch(emu, fake)
        async with operator(emu, memo(fake)):
            await cluster_with_two_coordinators(emu)
            held, release = hold_once(emu, "transactioncoordinators", "alpha")
            await asyncio.wait_for(held.wait(), timeout=WAIT_S)
            await change_image(emu, "segtxn:0.2.0", "r2")
            await wait_until(lambda: status(emu, "SegtxnCluster", "demo").get(
                "observedGeneration") == 2, timeout=WAIT_S, what="the handler done")  # fmt: skip
            release.set()
            await controller(emu, "statefulsets", "demo-broker", generation=2, observed=2,
                             updated=0, ready=3, replicas=3)  # fmt: skip
            await brokers_replaced_before_any_coordinator(emu, fake)
            await brokers_done(emu, 2)
            await wait_until(lambda: image(emu, "alpha") == "segtxn:0.2.0", timeout=WAIT_S,
                             what="alpha applied, in its turn")  # fmt: skip
            assert image(emu, "beta") == "segtxn:0.1.0"
        assert breaches == []


def applied_for(emu: Emulator, coordinator: str) -> int | None:
    """The generation condition ``Applied`` True of ``coordinator`` says it applied."""
    found = [c for c in status(emu, "TransactionCoordinator", coordinator).get("conditions", [])
             if c["type"] == "Applied" and c["status"] == "True"]  # fmt: skip
    return int(found[0]["observedGeneration"]) if found else None


async def test_a_coordinators_status_tick_keeps_what_its_handler_wrote_meanwhile() -> None:
    """The coordinator's status timer computes its conditions from the body its tick began
    with, and a merge patch replaces the whole list: written as computed, it would undo the
    ``Applied`` its handler wrote while the tick ran. Held here at the tick's read of the
    Deployment (the brokers never said ready: the cluster's timer reads no coordinator)."""
    fake = fake_brokers()
    async with serving(fake), emulator() as emu:
        patches: list[tuple[str, Any]] = []
        emu.status_patches = patches
        async with operator(emu, memo(fake)):
            await running(emu)
            await emu.create("TransactionCoordinator", "alpha", {
                "clusterRef": "demo", "replicas": 2, "statusIntervalSeconds": 1})  # fmt: skip
            await wait_until(lambda: applied_for(emu, "alpha") == 1, timeout=WAIT_S,
                             what="alpha applied")  # fmt: skip
            held, release = hold_once(emu, "deployments", "alpha-coordinator")
            await asyncio.wait_for(held.wait(), timeout=WAIT_S)
            await emu.patch("TransactionCoordinator", "alpha", {"spec": {"gcSweepSeconds": 5}})
            await wait_until(lambda: applied_for(emu, "alpha") == 2, timeout=WAIT_S,
                             what="the handler's Applied")  # fmt: skip
            before = len(patches)
            release.set()
            await wait_until(
                lambda: any(name == "alpha" and "lastChecked" in json.dumps(body)
                            for name, body in patches[before:]),
                timeout=WAIT_S, what="the held tick's write",
            )  # fmt: skip
            assert applied_for(emu, "alpha") == 2
            conditions = status(emu, "TransactionCoordinator", "alpha")["conditions"]
            kinds = {c["type"] for c in conditions}
            assert kinds == {"Applied", "Ready", "Reachable"}  # no coordinator answers here


async def test_a_coordinators_status_write_keeps_what_its_handler_wrote_meanwhile() -> None:
    """A merge patch replaces the whole ``conditions`` list: the coordinator's status timer
    wrote the handler's ``Applied`` back as it had read it, and a handler's write between
    that read and that write was undone for good (a handler writes ``Applied`` once per
    change). Here the timer's status write is held while the handler writes."""
    fake = fake_brokers()
    async with serving(fake), emulator() as emu, operator(emu, memo(fake)):
        await running(emu)
        await emu.create("TransactionCoordinator", "alpha", {
            "clusterRef": "demo", "replicas": 2, "statusIntervalSeconds": 1})  # fmt: skip
        await wait_until(lambda: applied_for(emu, "alpha") == 1 and "lastChecked" in status(
            emu, "TransactionCoordinator", "alpha"), timeout=WAIT_S,
            what="alpha applied and checked")  # fmt: skip

        def timer_write(request: kmock.Request) -> bool:
            return (request.name == "alpha" and request.subresource == "status"
                    and "lastChecked" in json.dumps(request.data))  # fmt: skip

        held, release = hold_first(emu, timer_write)
        await asyncio.wait_for(held.wait(), timeout=WAIT_S)
        checked = status(emu, "TransactionCoordinator", "alpha")["lastChecked"]
        await emu.patch("TransactionCoordinator", "alpha", {"spec": {"gcSweepSeconds": 5}})
        await wait_until(lambda: applied_for(emu, "alpha") == 2, timeout=WAIT_S,
                         what="the handler's Applied")  # fmt: skip
        release.set()
        await wait_until(
            lambda: status(emu, "TransactionCoordinator", "alpha")["lastChecked"] != checked,
            timeout=WAIT_S, what="a timer write after the held one",
        )  # fmt: skip
        assert applied_for(emu, "alpha") == 2
        conditions = status(emu, "TransactionCoordinator", "alpha")["conditions"]
        assert {c["type"] for c in conditions} == {"Applied", "Ready", "Reachable"}


async def test_an_operator_restarted_during_the_coordinators_turn_goes_on_in_order() -> None:
    fake = fake_brokers()
    async with serving(fake), emulator() as emu:
        watch(emu, fake)
        async with operator(emu, memo(fake)):
            await cluster_with_two_coordinators(emu)
            await change_image(emu, "segtxn:0.2.0", "r2")
            await controller(emu, "statefulsets", "demo-broker", generation=2, observed=2,
                             updated=0, ready=3, replicas=3)  # fmt: skip
            for k, name in enumerate(reversed(BROKERS), start=1):
                await replaced(emu, fake, k, name, "r2")
            await brokers_done(emu, 2)
            await wait_until(lambda: image(emu, "alpha") == "segtxn:0.2.0", timeout=WAIT_S,
                             what="alpha applied")  # fmt: skip
        # Stopped while alpha's Deployment rolls (its controller has not acted on the new
        # template yet). A new operator reads where it is from the live objects: it waits
        # for alpha, and only then applies beta.
        async with operator(emu, memo(fake)):
            await wait_until(
                lambda: rolling(emu).get("message", "").startswith(
                    "TransactionCoordinator alpha (1 of 2): Deployment alpha-coordinator"),
                timeout=WAIT_S, what="alpha's roll said again",
            )  # fmt: skip
            assert "has not acted on generation 2" in rolling(emu)["message"]
            assert image(emu, "beta") == "segtxn:0.1.0"
            await coordinators_done(emu, "alpha", 2)
            await wait_until(lambda: image(emu, "beta") == "segtxn:0.2.0", timeout=WAIT_S,
                             what="beta applied after alpha")  # fmt: skip
        assert [a for a, _ in fake.log].count("drain") == 3  # no broker rolled again
