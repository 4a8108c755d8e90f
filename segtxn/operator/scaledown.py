"""The scale-down guard: a SegtxnCluster's broker count goes down only when the brokers
that would go hold no data.

A StatefulSet scaled from N to M removes the brokers with the highest ordinals,
``<cluster>-broker-M`` .. ``-(N-1)``. Every topic and segment lives on its home broker's
disk and never moves (ledgers are not replicated; :mod:`segtxn.topics.catalog`), so a
removed broker's topics become unreadable while the store still lists them. The guard
asks the brokers' admin API which topics and segments are homed on each broker that would
go (``GET /admin/v2/brokers/{id}/homes``: one bounded index read each, answered from the
store, whether that broker is alive or not) and allows the change only when none is.
When the brokers cannot answer, it refuses: not knowing is not "empty".

What it cannot see: a topic created on a broker that is about to go, after the check and
before its pod stops (new topics are placed on the live broker with the fewest homes, so
an empty one is the likeliest). Such a topic is not lost: the StatefulSet keeps a removed
broker's PersistentVolumeClaim (its default ``persistentVolumeClaimRetentionPolicy``,
Retain), and scaling back up brings the broker back with its data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from segtxn.client.admin import Admin, BrokerHomes
from segtxn.client.errors import Timeout
from segtxn.protocol.errors import ServerError

NAMED = 5
"""Homes named per broker in a refusal (``and more`` beyond)."""


@dataclass(frozen=True)
class Verdict:
    """Whether the broker count may go from ``current`` to ``wanted``, and why."""

    allowed: bool
    message: str


def going(statefulset: str, current: int, wanted: int) -> list[str]:
    """The broker ids (pod names) a StatefulSet scaled from ``current`` to ``wanted``
    removes: the highest ordinals."""
    return [f"{statefulset}-{ordinal}" for ordinal in range(wanted, current)]


def refusal(current: int, wanted: int, held: Sequence[BrokerHomes]) -> str:
    """Why ``current`` -> ``wanted`` brokers is refused: who holds what, and what to do."""
    parts = []
    for homes in held:
        more = " and more" if homes.more or len(homes.homes) > NAMED else ""
        parts.append(f"{homes.broker} holds {', '.join(homes.homes[:NAMED])}{more}")
    return (
        f"spec.brokers.replicas {current} -> {wanted} refused: {'; '.join(parts)}. Their data "
        "is on those brokers' disks (ledgers are not replicated) and would become unreadable. "
        f"Delete those topics first, or keep {current} brokers. Nothing of this spec was "
        "applied; the operator checks again until it can."
    )


async def check(admin: Admin, statefulset: str, current: int, wanted: int) -> Verdict:
    """May the brokers of ``statefulset`` go from ``current`` to ``wanted``? Refused
    when a broker that would go holds a topic or segment, or when the brokers do not
    answer (then it is unknown)."""
    ids = going(statefulset, current, wanted)
    held = []
    try:
        for broker in ids:
            homes = await admin.broker_homes(broker, limit=NAMED + 1)
            if not homes.empty:
                held.append(homes)
    except (ServerError, Timeout) as e:
        return Verdict(
            False,
            f"spec.brokers.replicas {current} -> {wanted} refused: cannot tell whether "
            f"{', '.join(ids)} hold data, the brokers did not answer ({e}). Nothing of this "
            "spec was applied; the operator checks again until they answer.",
        )
    if held:
        return Verdict(False, refusal(current, wanted, held))
    return Verdict(True, f"{', '.join(ids)} hold no topics or segments: scaling to {wanted}")
