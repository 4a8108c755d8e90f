"""The scale-down guard: a SegtxnCluster's broker count goes down only when the brokers
that would go hold no data.

A StatefulSet scaled from N to M removes the brokers with the highest ordinals,
``<cluster>-broker-M`` .. ``-(N-1)``. Without replication every topic and segment lives
on its home broker's disk and never moves (:mod:`segtxn.topics.catalog`), so a removed
broker's topics become unreadable while the store still lists them. With replication
(``spec.brokers.replication``, :mod:`.replication`) refusing is still right: ledgers
written before it was turned on are on their home's disk alone, and the replicas a
removed broker keeps of other brokers' ledgers are gone with it (nothing re-replicates
them yet), so a take-over of its topics may find too few. The guard
asks the brokers' admin API which topics and segments are homed on each broker that would
go (``GET /admin/v2/brokers/{id}/homes``: one bounded index read each, answered from the
store, whether that broker is alive or not) and allows the change only when none is.
When the brokers cannot answer, it refuses: not knowing is not "empty". With replication
``W/A`` it also refuses, before asking anyone, to go below ``W`` brokers: new ledgers
would get fewer than ``W`` replicas (less durability than the spec asks for), and one more
broker lost below ``A`` stops writes. That refusal is final (only a new spec heals it);
the others are checked again, since the topics may be deleted meanwhile.

What it cannot see: a topic created on a broker that is about to go, after the check and
before its pod stops (new topics are placed on the live broker with the fewest homes, so
an empty one is the likeliest). Such a topic is not lost: the StatefulSet keeps a removed
broker's PersistentVolumeClaim (its default ``persistentVolumeClaimRetentionPolicy``,
Retain), and scaling back up brings the broker back with its data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from segtxn.broker.settings import Replication
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
    final: bool = False
    """A refusal that checking again cannot lift (the spec itself must change)."""


def going(statefulset: str, current: int, wanted: int) -> list[str]:
    """The broker ids (pod names) a StatefulSet scaled from ``current`` to ``wanted``
    removes: the highest ordinals."""
    return [f"{statefulset}-{ordinal}" for ordinal in range(wanted, current)]


def refusal(
    current: int,
    wanted: int,
    held: Sequence[BrokerHomes],
    replication: Replication | None = None,
) -> str:
    """Why ``current`` -> ``wanted`` brokers is refused: who holds what, why that matters
    (with ``replication`` or without), and what to do."""
    parts = []
    for homes in held:
        more = " and more" if homes.more or len(homes.homes) > NAMED else ""
        parts.append(f"{homes.broker} holds {', '.join(homes.homes[:NAMED])}{more}")
    if replication is None:
        why = (
            "Their data is on those brokers' disks (ledgers are not replicated) and would "
            "become unreadable"
        )
    else:
        why = (
            f"With replication {replication}, their ledgers from before it was turned on are "
            "on those disks alone, and the replicas those brokers keep would be lost (nothing "
            "re-replicates them yet)"
        )
    first = held[0].broker if held else "<broker>"
    return (
        f"spec.brokers.replicas {current} -> {wanted} refused: {'; '.join(parts)}. {why}. "
        f"Delete those topics first (list a broker's with GET /admin/v2/brokers/{first}/homes; "
        "delete their ScalableTopic resources, or DELETE /admin/v2/...), then the scale-down "
        f"goes through; or set spec.brokers.replicas back to {current} (keep {current} "
        "brokers). Nothing of this spec was applied; the operator checks again until it can."
    )


def below_write_quorum(current: int, wanted: int, replication: Replication) -> Verdict:
    """The final refusal of ``current`` -> ``wanted`` brokers when ``wanted`` is below
    ``replication``'s write quorum."""
    w = replication.write_quorum
    return Verdict(
        False,
        f"spec.brokers.replicas {current} -> {wanted} refused: replication {replication} "
        f"writes each new ledger on {w} brokers, and {wanted} cannot hold {w} replicas. Keep "
        f"at least {w} brokers, or lower spec.brokers.replication's W (to at most {wanted}, "
        "with A at most a majority of it) in the same edit. Nothing of this spec was applied; "
        "it is not checked again until the spec changes.",
        final=True,
    )


async def check(
    admin: Admin,
    statefulset: str,
    current: int,
    wanted: int,
    replication: Replication | None = None,
) -> Verdict:
    """May the brokers of ``statefulset`` go from ``current`` to ``wanted``? Refused,
    finally, when ``wanted`` is below ``replication``'s write quorum (no broker is asked);
    refused, to be checked again, when a broker that would go holds a topic or segment, or
    when the brokers do not answer (then it is unknown)."""
    if replication is not None and wanted < replication.write_quorum:
        return below_write_quorum(current, wanted, replication)
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
        return Verdict(False, refusal(current, wanted, held, replication))
    return Verdict(True, f"{', '.join(ids)} hold no topics or segments: scaling to {wanted}")
