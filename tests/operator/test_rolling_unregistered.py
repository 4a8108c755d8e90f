"""The roll meeting a broker whose pod is Ready but which is not registered (it is gone
from the metadata store: its session expired, its process is not serving): its drain is
refused 404 ``InvalidArgument`` (a 503 ``ServiceNotReady`` once, which the client retried
for the whole drain timeout). There is nothing to drain: the roll replaces its pod, as it
does a pod that is not Ready, rather than stalling on it. Same harness as
tests/operator/test_rolling.py."""

from __future__ import annotations

import pytest

from tests.operator.emulator import emulator, operator
from tests.operator.fakebrokers import serving
from tests.operator.support import WAIT_S, status
from tests.operator.test_rolling import (
    BROKERS,
    change_image,
    cond,
    fake_brokers,
    memo,
    replaced,
    revision,
    running,
    watch,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)


async def test_a_broker_that_is_not_registered_is_replaced_without_a_drain() -> None:
    fake = fake_brokers()
    fake.unregistered.add("demo-broker-2")
    async with serving(fake), emulator() as emu:
        watch(emu, fake)
        async with operator(emu, memo(fake, drain_timeout_s=30)):
            await running(emu, replication="3/2")
            await change_image(emu, "segtxn:0.2.0", "r2")
            fake.homes["demo-broker-2"] = []  # (taken over by the others meanwhile)
            await replaced(emu, fake, 1, "demo-broker-2", "r2")
            fake.unregistered.clear()  # its new pod registers
            for k, name in enumerate(reversed(BROKERS[:2]), start=2):
                await replaced(emu, fake, k, name, "r2")
            await wait_until(lambda: cond(emu, "Rolling").get("reason") == "UpToDate",
                             timeout=WAIT_S, what="the roll done")  # fmt: skip
            assert "roll" not in status(emu, "SegtxnCluster", "demo")
        assert fake.log[:2] == [("unregistered", "demo-broker-2"), ("delete", "demo-broker-2")]
        assert cond(emu, "Degraded").get("reason") != "RollStalled"
        assert [revision(emu, b) for b in BROKERS] == ["r2", "r2", "r2"]
        replacing = [m for _, r, m in emu.events("demo") if r == "Replacing"]
        assert "demo-broker-2): pod evicted; not drained: it is not registered" in replacing[0]
