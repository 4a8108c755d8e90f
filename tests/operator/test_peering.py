"""The operator says so at start-up when the Kopf peering object it waits for is missing.

With a peering name Kopf keeps every watch paused until the object exists, and says it
only at DEBUG: the operator runs, looks healthy and handles nothing. These run the
operator with peering on against the emulated API server, with and without the object,
and the check itself for the cluster-wide object and for an API server it cannot read."""

from __future__ import annotations

import logging

import kopf
import pytest

from segtxn.operator import peering
from segtxn.operator.kube import Kube
from segtxn.operator.runtime import OperatorConfig
from tests.operator.emulator import NS, Emulator, emulator, operator
from tests.waiting import wait_until

PEERING = "segtxn-test"


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == peering.__name__ and r.levelno == logging.WARNING
    ]


async def create_peering(emu: Emulator, namespace: str | None) -> None:
    kind = "ClusterKopfPeering" if namespace is None else "KopfPeering"
    scope = "" if namespace is None else f"/namespaces/{namespace}"
    plural = "clusterkopfpeerings" if namespace is None else "kopfpeerings"
    code, body = await emu.call("POST", f"/apis/kopf.dev/v1{scope}/{plural}",
                                {"apiVersion": "kopf.dev/v1", "kind": kind,
                                 "metadata": {"name": PEERING}})  # fmt: skip
    assert code in (200, 201), body


def memo() -> kopf.Memo:
    nowhere = "http://127.0.0.1:1"
    config = OperatorConfig(broker_url=nowhere, coordinator_url=nowhere, namespaces=(NS,))
    return kopf.Memo(config=config)


@pytest.mark.parametrize("exists", [False, True], ids=["missing", "present"])
async def test_a_missing_peering_object_is_a_warning_at_start_up(
    caplog: pytest.LogCaptureFixture, exists: bool
) -> None:
    caplog.set_level(logging.INFO)
    async with emulator() as emu:
        if exists:
            await create_peering(emu, NS)
        emu.requests = []
        # The operator's start-up handlers have run once it is ready. Stopped only once
        # Kopf watches the peering objects, i.e. has read the API's resources: stopped while
        # it reads them, its reads go on as leftover tasks (it reads each API group in a task
        # of asyncio.as_completed, which a cancel does not reach) and its stop waits 5 s.
        async with operator(emu, memo(), standalone=False, peering_name=PEERING, priority=1):
            await wait_until(
                lambda: any(r.plural == "kopfpeerings" and r.watching for r in emu.requests or ()),
                timeout=10,
                what="Kopf watching the peering objects",
            )
    if exists:
        assert warnings(caplog) == []
    else:
        [warning] = warnings(caplog)
        assert f"KopfPeering '{PEERING}' does not exist in namespace '{NS}'" in warning
        assert "paused" in warning and f"kubectl -n {NS} apply" in warning
        assert "--standalone" in warning


async def test_the_cluster_wide_object_is_looked_for_without_a_namespace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with emulator() as emu:
        kube = Kube(kopf.ConnectionInfo(server=str(emu.url), insecure=True))
        try:
            await peering.warn_if_missing(kube, PEERING, None)
            [warning] = warnings(caplog)
            assert warning.startswith(f"ClusterKopfPeering '{PEERING}' does not exist:")
            caplog.clear()
            await create_peering(emu, None)
            await peering.warn_if_missing(kube, PEERING, None)
            assert warnings(caplog) == []
            # A KopfPeering of the name in a namespace is not the cluster one, and back.
            assert await peering.missing(kube, PEERING, [NS]) == [NS]
        finally:
            await kube.close()


async def test_a_check_that_cannot_read_says_so(caplog: pytest.LogCaptureFixture) -> None:
    kube = Kube(kopf.ConnectionInfo(server="http://127.0.0.1:1", insecure=True))
    try:
        await peering.warn_if_missing(kube, PEERING, [NS])
    finally:
        await kube.close()
    [warning] = warnings(caplog)
    assert warning.startswith(f"Cannot check that Kopf's peering object '{PEERING}' exists")
