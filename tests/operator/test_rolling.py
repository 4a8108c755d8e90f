"""The operator's rolling restart and its drains (Kopf against kmock; the brokers' admin
endpoints faked, tests/operator/fakebrokers.py: no kubelet runs the pods here, so the test
plays the StatefulSet's controller: it makes each pod, on the revision it is told, when
the operator has deleted the old one).

Before this, the StatefulSet rolled itself (RollingUpdate) and nothing was drained: every
test here fails on that code (no pod is deleted, no drain is asked, a scale-down of a
broker holding topics is refused)."""

from __future__ import annotations

from typing import Any

import aiohttp
import kopf
import pytest

from segtxn.client.admin import Admin
from segtxn.client.connection import Connector
from segtxn.operator.handlers import OperatorConfig
from segtxn.operator.rolling import undrain_broker
from segtxn.operator.rollstate import REVISION_LABEL, RollSettings
from tests.operator.emulator import NS, Emulator, emulator, operator
from tests.operator.fakebrokers import FakeBrokers, serving
from tests.operator.support import WAIT_S, status
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)
STORE = "etcd://e:2379/rolling"
STS = "apps/v1/statefulsets"
BROKERS = [f"demo-broker-{i}" for i in range(3)]


def memo(fake: FakeBrokers, **roll: float) -> kopf.Memo:
    settings = RollSettings(**{"drain_timeout_s": 30, "ready_timeout_s": 60, "retry_s": 3600,
                               **roll})  # fmt: skip
    config = OperatorConfig(broker_url=fake.url, coordinator_url="http://127.0.0.1:1",
                            roll=settings)  # fmt: skip
    return kopf.Memo(config=config)


def fake_brokers(n: int = 3) -> FakeBrokers:
    return FakeBrokers({f"demo-broker-{i}": [f"topic://t/n/of-{i}"] for i in range(n)})


def cond(emu: Emulator, which: str) -> dict[str, Any]:
    found = [c for c in status(emu, "SegtxnCluster", "demo").get("conditions", [])
             if c["type"] == which]  # fmt: skip
    return dict(found[0]) if found else {}


def revision(emu: Emulator, name: str) -> str | None:
    pod = emu.get("v1/pods", name)
    return None if pod is None else str(pod["metadata"]["labels"][REVISION_LABEL])


async def make_pod(emu: Emulator, name: str, rev: str) -> None:
    """What the StatefulSet's controller and the kubelet do: a pod of ``rev``, Ready."""
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "labels": {REVISION_LABEL: rev}},
           "status": {"conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip
    code, body = await emu.call("POST", f"/api/v1/namespaces/{NS}/pods", pod)
    assert code in (200, 201), body


async def set_revision(emu: Emulator, rev: str) -> None:
    """The controller has seen the latest template (its generation observed): its
    revision is ``rev``."""
    found = emu.get(STS, "demo-broker")
    assert found is not None
    seen = {"updateRevision": rev, "observedGeneration": found["metadata"]["generation"]}
    path = f"/apis/apps/v1/namespaces/{NS}/statefulsets/demo-broker/status"
    code, body = await emu.call("PATCH", path, {"status": seen})
    assert code == 200, body


async def running(emu: Emulator, replicas: int = 3, **brokers: Any) -> None:
    """Cluster ``demo`` applied, its pods up on revision r1, nothing to roll."""
    spec = {"metadataStore": {"url": STORE}, "brokers": {"replicas": replicas, **brokers}}
    await emu.create("SegtxnCluster", "demo", spec)
    await wait_until(lambda: emu.get(STS, "demo-broker") is not None, timeout=WAIT_S,
                     what="the StatefulSet")  # fmt: skip
    sts = emu.get(STS, "demo-broker")
    assert sts is not None and sts["spec"]["updateStrategy"] == {"type": "OnDelete"}
    for i in range(replicas):
        await make_pod(emu, f"demo-broker-{i}", "r1")
    await set_revision(emu, "r1")
    await wait_until(lambda: cond(emu, "Rolling").get("reason") == "UpToDate", timeout=WAIT_S,
                     what="nothing to roll")  # fmt: skip


async def change_image(emu: Emulator, image: str, rev: str) -> None:
    await emu.patch("SegtxnCluster", "demo", {"spec": {"image": image}})

    def applied() -> bool:
        sts = emu.get(STS, "demo-broker") or {}
        return bool(sts["spec"]["template"]["spec"]["containers"][0]["image"] == image)

    await wait_until(applied, timeout=WAIT_S, what=f"{image} applied")
    await set_revision(emu, rev)


def watch(emu: Emulator, fake: FakeBrokers) -> list[str]:
    """Record each pod deletion in ``fake.log`` and check the roll's invariants at each
    drain and deletion: every other broker's pod is there and Ready (one down at a
    time), and a deleted broker held nothing (drained first). The breaches are returned
    (a list the test asserts empty)."""
    breaches: list[str] = []

    def others_ready(broker: str) -> None:
        for name in fake.homes:
            pod = emu.get("v1/pods", name)
            if name != broker and name in BROKERS and pod is None:
                breaches.append(f"{broker} touched while {name} has no pod")

    def deleted(plural: str, name: str) -> None:
        if plural == "pods":
            fake.log.append(("delete", name))
            fake.draining.discard(name)  # a restarted broker registers un-drained
            others_ready(name)
            if fake.replicated and fake.homes.get(name):
                breaches.append(f"{name} deleted holding {fake.homes[name]}")

    emu.deleted = deleted
    fake.before_drain = others_ready
    return breaches


async def replaced(emu: Emulator, fake: FakeBrokers, k: int, name: str, rev: str) -> None:
    """Wait until the operator deleted ``name``'s pod and says so (``broker k of 3``, in
    status.roll too), then make its successor on ``rev``."""
    await wait_until(lambda: ("delete", name) in fake.log, timeout=WAIT_S, what=f"{name} deleted")
    waiting = f"broker {k} of 3 ({name}): waiting for its new pod to be ready"
    await wait_until(lambda: cond(emu, "Rolling").get("message") == waiting, timeout=WAIT_S,
                     what=waiting)  # fmt: skip
    roll = status(emu, "SegtxnCluster", "demo")["roll"]
    assert (roll["broker"], roll["step"], roll["revision"]) == (name, "Replacing", rev)
    await make_pod(emu, name, rev)


async def each_replaced(emu: Emulator, fake: FakeBrokers, rev: str = "r2") -> None:
    """Every broker replaced by :func:`replaced`, highest first, then the roll said done."""
    for k, name in enumerate(reversed(BROKERS), start=1):
        await replaced(emu, fake, k, name, rev)
    await wait_until(lambda: cond(emu, "Rolling").get("reason") == "UpToDate",
                     timeout=WAIT_S, what="the roll done")  # fmt: skip


async def test_a_roll_drains_then_replaces_one_broker_at_a_time_from_the_highest() -> None:
    fake = fake_brokers()
    async with serving(fake), emulator() as emu:
        breaches = watch(emu, fake)
        async with operator(emu, memo(fake)):
            await running(emu, replication="3/2")
            assert fake.log == []  # nothing to roll: nothing drained, nothing deleted
            await change_image(emu, "segtxn:0.2.0", "r2")
            await each_replaced(emu, fake)
            assert "roll" not in status(emu, "SegtxnCluster", "demo")
        assert fake.log == [(a, b) for b in reversed(BROKERS) for a in ("drain", "delete")]
        assert breaches == []
        assert [revision(emu, b) for b in BROKERS] == ["r2", "r2", "r2"]
        reasons = [r for _, r, _ in emu.events("demo")]
        assert reasons.count("Drained") == 3 and reasons.count("Replacing") == 3


async def test_without_replication_brokers_are_replaced_undrained_in_the_same_order() -> None:
    fake = fake_brokers()
    fake.replicated = False
    async with serving(fake), emulator() as emu:
        breaches = watch(emu, fake)
        async with operator(emu, memo(fake)):
            await running(emu)
            await change_image(emu, "segtxn:0.2.0", "r2")
            await each_replaced(emu, fake)
        assert fake.log == [("delete", b) for b in reversed(BROKERS)]  # no drain asked
        assert breaches == []


async def test_an_operator_restarted_mid_roll_goes_on_with_the_next_broker() -> None:
    fake = fake_brokers()
    async with serving(fake), emulator() as emu:
        breaches = watch(emu, fake)
        async with operator(emu, memo(fake)):
            await running(emu, replication="3/2")
            await change_image(emu, "segtxn:0.2.0", "r2")
            await replaced(emu, fake, 1, "demo-broker-2", "r2")
            await wait_until(lambda: ("delete", "demo-broker-1") in fake.log, timeout=WAIT_S,
                             what="broker 2 of 3 deleted")  # fmt: skip
            await wait_until(
                lambda: (
                    status(emu, "SegtxnCluster", "demo").get("roll", {}).get("step") == "Replacing"
                    and status(emu, "SegtxnCluster", "demo")["roll"]["broker"] == "demo-broker-1"
                ),
                timeout=WAIT_S,
                what="broker 2 of 3 recorded as being replaced",
            )
        # Stopped with demo-broker-1's pod gone. A new operator reads status.roll: it
        # waits for that pod, and does not drain demo-broker-2 (done) again.
        before = len(fake.log)
        async with operator(emu, memo(fake)):
            await make_pod(emu, "demo-broker-1", "r2")
            await replaced(emu, fake, 3, "demo-broker-0", "r2")
            await wait_until(lambda: cond(emu, "Rolling").get("reason") == "UpToDate",
                             timeout=WAIT_S, what="the roll done")  # fmt: skip
        assert fake.log[before:] == [("drain", "demo-broker-0"), ("delete", "demo-broker-0")]
        assert breaches == []


async def test_a_drain_that_fails_stalls_the_roll_until_the_next_change() -> None:
    fake = fake_brokers()
    fake.stuck.add("demo-broker-2")
    async with serving(fake), emulator() as emu:
        watch(emu, fake)
        async with operator(emu, memo(fake, drain_timeout_s=1)):
            await running(emu, replication="3/2")
            await change_image(emu, "segtxn:0.2.0", "r2")
            await wait_until(lambda: cond(emu, "Degraded").get("reason") == "RollStalled",
                             timeout=WAIT_S, what="the roll stalled")  # fmt: skip
            degraded = cond(emu, "Degraded")
            assert degraded["status"] == "True"
            assert "stopped at broker 1 of 3 (demo-broker-2)" in degraded["message"]
            assert "draining did not empty it within 1 s" in degraded["message"]
            assert "demo-broker-2 was undrained" in degraded["message"]
            rolling = cond(emu, "Rolling")
            assert (rolling["status"], rolling["reason"]) == ("False", "RollStalled")
            assert rolling["observedGeneration"] == 2 and rolling["lastTransitionTime"]
            await wait_until(
                lambda: ("Warning", "RollStalled") in [(t, r) for t, r, _ in emu.events("demo")],
                timeout=WAIT_S,
                what="a Warning event",
            )
            # Nothing was deleted, no other broker drained; the stuck one undrained.
            assert {b for a, b in fake.log} == {"demo-broker-2"}
            assert fake.log[-1] == ("undrain", "demo-broker-2")
            assert all(a != "delete" for a, _ in fake.log)
            assert [revision(emu, b) for b in BROKERS] == ["r1", "r1", "r1"]

            # The next change retries at once (the backoff is an hour here).
            fake.stuck.clear()
            await change_image(emu, "segtxn:0.3.0", "r3")
            await replaced(emu, fake, 1, "demo-broker-2", "r3")
            await wait_until(lambda: cond(emu, "Degraded").get("status") == "False",
                             timeout=WAIT_S, what="Degraded cleared")  # fmt: skip


async def test_a_scale_down_with_replication_drains_then_shrinks() -> None:
    fake = fake_brokers(4)
    async with serving(fake), emulator() as emu:
        async with operator(emu, memo(fake)):
            spec = {"metadataStore": {"url": STORE},
                    "brokers": {"replicas": 4, "replication": "3/2"}}  # fmt: skip
            await emu.create("SegtxnCluster", "demo", spec)
            await wait_until(lambda: emu.get(STS, "demo-broker") is not None, timeout=WAIT_S,
                             what="the StatefulSet")  # fmt: skip
            await emu.patch("SegtxnCluster", "demo", {"spec": {"brokers": {"replicas": 3}}})
            await wait_until(
                lambda: (emu.get(STS, "demo-broker") or {})["spec"]["replicas"] == 3,
                timeout=WAIT_S,
                what="the StatefulSet shrunk",
            )
            await wait_until(
                lambda: "ReplicasLost" in [r for _, r, _ in emu.events("demo")],
                timeout=WAIT_S,
                what="the ReplicasLost event",
            )
        assert fake.log == [("drain", "demo-broker-3")]  # the one that goes, only
        assert fake.homes["demo-broker-3"] == []
        assert sorted(t for b in BROKERS for t in fake.homes[b]) == [
            f"topic://t/n/of-{i}" for i in range(4)
        ]
        lost = [m for t, r, m in emu.events("demo") if r == "ReplicasLost"]
        assert lost[0].startswith("demo-broker-3 go with their replicas of other brokers'")
        assert cond(emu, "Applied")["status"] == "True"


async def test_an_eviction_the_budget_refuses_is_retried_then_goes_through() -> None:
    fake = fake_brokers()
    async with serving(fake), emulator() as emu:
        breaches = watch(emu, fake)
        async with operator(emu, memo(fake)):
            await running(emu, replication="3/2")
            emu.refuse_evictions = "Cannot evict pod as it would violate the disruption budget"
            await change_image(emu, "segtxn:0.2.0", "r2")
            await wait_until(lambda: cond(emu, "Rolling").get("reason") == "Evicting",
                             timeout=WAIT_S, what="the eviction refused")  # fmt: skip
            message = cond(emu, "Rolling")["message"]
            assert message.startswith("broker 1 of 3 (demo-broker-2): eviction refused")
            assert "would violate the disruption budget" in message
            roll = status(emu, "SegtxnCluster", "demo")["roll"]
            assert (roll["broker"], roll["step"]) == ("demo-broker-2", "Evicting")
            assert revision(emu, "demo-broker-2") == "r1"  # still running: nothing deleted
            emu.refuse_evictions = None  # the budget allows it again
            await each_replaced(emu, fake)
        # Drained once: the retried eviction did not drain it again.
        assert fake.log == [(a, b) for b in reversed(BROKERS) for a in ("drain", "delete")]
        assert breaches == []


async def test_an_eviction_refused_past_its_timeout_stalls_the_roll_and_undrains() -> None:
    fake = fake_brokers()
    async with serving(fake), emulator() as emu:
        watch(emu, fake)
        async with operator(emu, memo(fake, evict_timeout_s=1)):
            await running(emu, replication="3/2")
            emu.refuse_evictions = "Cannot evict pod as it would violate the disruption budget"
            await change_image(emu, "segtxn:0.2.0", "r2")
            await wait_until(lambda: cond(emu, "Degraded").get("reason") == "RollStalled",
                             timeout=WAIT_S, what="the roll stalled")  # fmt: skip
            degraded = cond(emu, "Degraded")["message"]
            assert "stopped at broker 1 of 3 (demo-broker-2)" in degraded
            assert "its pod could not be evicted within 1 s" in degraded
            assert "demo-broker-2 was undrained" in degraded
            assert fake.log == [("drain", "demo-broker-2"), ("undrain", "demo-broker-2")]
            assert [revision(emu, b) for b in BROKERS] == ["r1", "r1", "r1"]


@pytest.mark.parametrize("gone", [False, True])
async def test_a_stall_s_undrain_says_what_it_did(gone: bool) -> None:
    """A broker gone by the time its stalled roll undrains it (its pod died) was said to
    be "could not be undrained (...): it takes no new topics until it restarts": it has no
    drain to stop (gone, it starts undrained; still running with its registration lost, it
    comes back draining until the roll's retry)."""
    fake = fake_brokers()
    if gone:
        fake.unregistered.add("demo-broker-2")
    async with serving(fake), aiohttp.ClientSession() as http:
        admin = Admin(Connector(fake.url, http, request_timeout_s=30))
        said = await undrain_broker(admin, "demo-broker-2")
    assert said == (
        "demo-broker-2 is not registered now: gone, it starts undrained; still running, it "
        "registers again still draining until the roll is tried again"
        if gone
        else "demo-broker-2 was undrained: it takes new topics again"
    )
