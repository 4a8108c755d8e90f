"""spec.brokers.replication through the operator (Kopf against kmock; no segtxn processes:
none of these refusals asks the brokers): rendered into the brokers' command line, may be
turned on later, refused when turned off or not runnable, and a scale-down below W refused
for good."""

from __future__ import annotations

from typing import Any

import pytest

from tests.operator.emulator import Emulator, emulator, operator
from tests.operator.support import WAIT_S, config_of, offline, status
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)
STORE = "etcd://e:2379/replication"
STS = "apps/v1/statefulsets"


def applied(emu: Emulator) -> dict[str, Any]:
    found = [c for c in status(emu, "SegtxnCluster", "demo").get("conditions", [])
             if c["type"] == "Applied"]  # fmt: skip
    return dict(found[0]) if found else {}


def failed_for_good(caplog: pytest.LogCaptureFixture, message: str) -> bool:
    """Kopf logged that the cluster's handler failed permanently with ``message`` (it is
    not retried: only a new spec runs it again)."""
    return any(
        "failed permanently" in r.getMessage() and message in r.getMessage() for r in caplog.records
    )


def replication(emu: Emulator) -> str | None:
    """The W/A the live brokers' ConfigMap holds (None: off, or nothing applied)."""
    config = config_of(emu)
    return None if config is None else config["data"].get("replication")


def args(emu: Emulator) -> list[str]:
    sts = emu.get(STS, "demo-broker")
    assert sts is not None
    return list(sts["spec"]["template"]["spec"]["containers"][0]["args"])


async def create(emu: Emulator, **brokers: Any) -> None:
    await emu.create("SegtxnCluster", "demo", {"metadataStore": {"url": STORE}, "brokers": brokers})


async def test_turned_on_later_changed_and_never_turned_off() -> None:
    async with emulator() as emu, operator(emu, offline()):
        await create(emu, replicas=3)
        await wait_until(lambda: config_of(emu) is not None, timeout=WAIT_S, what="the brokers")
        assert replication(emu) is None
        assert not any("--replication" in a for a in args(emu))

        # On later: safe (only new ledgers are replicated); the brokers get the flag.
        await emu.patch("SegtxnCluster", "demo", {"spec": {"brokers": {"replication": "3/2"}}})
        await wait_until(lambda: replication(emu) == "3/2", timeout=WAIT_S, what="3/2 applied")
        assert "--replication=$(SEGTXN_REPLICATION)" in args(emu)
        pdb = emu.get("policy/v1/poddisruptionbudgets", "demo-broker")
        assert pdb is not None and pdb["spec"]["maxUnavailable"] == 1

        # Another W/A: allowed (each ledger keeps the quorums it was written with).
        await emu.patch("SegtxnCluster", "demo", {"spec": {"brokers": {"replication": "2/1"}}})
        await wait_until(lambda: replication(emu) == "2/1", timeout=WAIT_S, what="2/1 applied")

        # Off: refused whole (the image change riding along is not applied either).
        await emu.patch(
            "SegtxnCluster",
            "demo",
            {"spec": {"image": "segtxn:0.2.0", "brokers": {"replication": None}}},
        )
        await wait_until(
            lambda: applied(emu).get("reason") == "ImmutableField",
            timeout=WAIT_S,
            what="turning replication off refused",
        )
        refused = applied(emu)
        assert refused["status"] == "False"
        assert refused["message"].startswith(
            "spec.brokers.replication cannot be turned off (from '2/1' to 'off')"
        )
        assert replication(emu) == "2/1"
        assert "--replication=$(SEGTXN_REPLICATION)" in args(emu)
        sts = emu.get(STS, "demo-broker")
        assert sts is not None
        assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == "segtxn:0.1.0"
        await wait_until(
            lambda: any(
                (kind, reason) == ("Warning", "ImmutableField") and "replication" in message
                for kind, reason, message in emu.events("demo")
            ),
            timeout=WAIT_S,
            what="a Warning event naming the field",
        )

        # On again: the rest of the edit goes through.
        await emu.patch("SegtxnCluster", "demo", {"spec": {"brokers": {"replication": "3/2"}}})
        await wait_until(lambda: applied(emu).get("status") == "True", timeout=WAIT_S,
                         what="Applied True again")  # fmt: skip
        assert replication(emu) == "3/2"
        sts = emu.get(STS, "demo-broker")
        assert sts is not None
        assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == "segtxn:0.2.0"


@pytest.mark.parametrize(
    ("brokers", "message"),
    [
        ({"replicas": 2, "replication": "3/2"}, "raise replicas to at least 3, or lower W"),
        ({"replicas": 3, "replication": "3/3"}, "at most a majority of it"),
    ],
    ids=["W above the broker count", "A above a majority"],
)
async def test_a_replication_the_brokers_cannot_run_is_refused_before_anything_is_applied(
    brokers: dict[str, Any], message: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The CRD's CEL rule refuses these on a real API server; kmock runs no CEL, so this
    is the operator's own check: nothing is applied (brokers started with it would exit
    at once, or never place a ledger)."""
    async with emulator() as emu, operator(emu, offline()):
        await create(emu, **brokers)
        await wait_until(
            lambda: applied(emu).get("reason") == "InvalidReplication",
            timeout=WAIT_S,
            what="the spec refused",
        )
        assert message in applied(emu)["message"]
        assert applied(emu)["status"] == "False"
        assert emu.get(STS, "demo-broker") is None
        assert config_of(emu) is None
        await wait_until(lambda: failed_for_good(caplog, message), timeout=WAIT_S,
                         what="not retried: only a new spec heals it")  # fmt: skip


async def test_a_scale_down_below_w_is_refused_for_good_without_asking_the_brokers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The operator has no brokers to ask here (``offline``): the refusal names W, not
    "cannot tell", so the brokers were not asked; it is final (Kopf does not retry it)."""
    async with emulator() as emu, operator(emu, offline()):
        await create(emu, replicas=3, replication="3/2")
        await wait_until(lambda: replication(emu) == "3/2", timeout=WAIT_S, what="applied")
        await emu.patch("SegtxnCluster", "demo", {"spec": {"brokers": {"replicas": 2}}})
        await wait_until(
            lambda: applied(emu).get("reason") == "ScaleDownRefused",
            timeout=WAIT_S,
            what="the scale-down refused",
        )
        message = applied(emu)["message"]
        assert "spec.brokers.replicas 3 -> 2 refused: replication 3/2" in message
        assert "Keep at least 3 brokers" in message
        await wait_until(lambda: failed_for_good(caplog, "Keep at least 3 brokers"),
                         timeout=WAIT_S, what="not checked again")  # fmt: skip
        sts = emu.get(STS, "demo-broker")
        assert sts is not None and sts["spec"]["replicas"] == 3
        assert [r for _, r, _ in emu.events("demo")].count("ScaleDownRefused") == 1
