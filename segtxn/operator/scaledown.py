"""The scale-down guard: a SegtxnCluster's broker count goes down only when the brokers
that would go hold no data, drained first when they can be.

A StatefulSet scaled from N to M removes the brokers with the highest ordinals,
``<cluster>-broker-M`` .. ``-(N-1)``. Without replication every topic and segment lives
on its home broker's disk and never moves (:mod:`segtxn.topics.catalog`), so a removed
broker's topics would become unreadable while the store still lists them: the guard only
refuses. With replication (``spec.brokers.replication``, :mod:`.replication`) it first
drains each broker that would go (``POST /admin/v2/brokers/{id}/drain``: its topics and
segments move to the others, nothing new is placed on it), then checks as without. What
a drain cannot move stays and refuses the change: ledgers written before replication was
turned on are on their home's disk alone. What the drain does not move: the replicas a
removed broker keeps of *other* brokers' ledgers. They go with it: each such ledger has
one copy fewer until its owner's background repair copies it to another broker, once the
removed broker has been unregistered for 5 minutes (docs/ledger.md, "Repair").
:attr:`Verdict.lost` says so, for a Warning event.

The check asks the brokers' admin API which topics and segments are homed on each
broker that would go (``GET /admin/v2/brokers/{id}/homes``: one bounded index read each,
answered from the store, whether that broker is alive or not) and allows the change only
when none is. When the brokers cannot answer, it refuses: not knowing is not "empty".
With replication ``W/A`` it also refuses, before asking anyone, to go below ``W``
brokers: new ledgers would get fewer than ``W`` replicas (less durability than the spec
asks for), and one more broker lost below ``A`` stops writes. That refusal is final (only
a new spec heals it); the others are checked again, since the topics may be deleted (or
drained) meanwhile. A drained broker whose scale-down is then refused or not applied
stays draining (it takes no new topics) until it restarts or ``DELETE .../drain``.

What it cannot see, without replication: a topic created on a broker that is about to
go, after the check and before its pod stops (new topics are placed on the live broker
with the fewest homes, so an empty one is the likeliest). Such a topic is not lost: the
StatefulSet keeps a removed broker's PersistentVolumeClaim (its default
``persistentVolumeClaimRetentionPolicy``, Retain), and scaling back up brings the broker
back with its data. A drained broker takes no new topics, so with replication that
window is closed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from segtxn.client.admin import Admin, BrokerHomes
from segtxn.client.errors import Timeout
from segtxn.ledger.replicas import Replication
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
    lost: str | None = None
    """Allowed with replication: what goes with the removed brokers (their replicas of
    other brokers' ledgers), for a Warning event."""


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
            f"With replication {replication} they were drained, but these stayed: a ledger "
            "written before replication was turned on is on its broker's disk alone and "
            "cannot move (nor can a topic whose move failed: draining again retries it)"
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
    *,
    replication: Replication | None = None,
    drain_timeout_s: float = 300.0,
) -> Verdict:
    """May the brokers of ``statefulset`` go from ``current`` to ``wanted``? Refused,
    finally, when ``wanted`` is below ``replication``'s write quorum (no broker is asked).
    With ``replication`` each broker that would go is drained first (a drain that fails,
    within ``drain_timeout_s`` each, is said in the refusal, if one follows). Then refused,
    to be checked again, when a broker that would go holds a topic or segment, or when
    the brokers do not answer (then it is unknown)."""
    if replication is not None and wanted < replication.write_quorum:
        return below_write_quorum(current, wanted, replication)
    ids = going(statefulset, current, wanted)
    drained = await _drain(admin, ids, drain_timeout_s) if replication is not None else {}
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
        failures = [f"draining {b} failed: {why}" for b, why in drained.items() if why]
        said = f" ({'; '.join(failures)})" if failures else ""
        return Verdict(False, refusal(current, wanted, held, replication) + said)
    if replication is None:
        return Verdict(True, f"{', '.join(ids)} hold no topics or segments: scaling to {wanted}")
    return Verdict(
        True,
        f"{', '.join(ids)} drained, they hold no topics or segments: scaling to {wanted}",
        lost=(
            f"{', '.join(ids)} go with their replicas of other brokers' ledgers (replication "
            f"{replication}): each such ledger has one copy fewer until its owner's "
            "background repair copies it to another broker, 5 minutes after they are gone"
        ),
    )


async def _drain(admin: Admin, ids: Sequence[str], timeout_s: float) -> dict[str, str]:
    """Drain each of ``ids`` in turn; broker -> why its drain failed ("" when it did not).
    A failure is not final: the homes check that follows decides (a broker that is not
    running cannot drain, but its topics may have been taken over already)."""
    failed: dict[str, str] = {}
    for broker in ids:
        try:
            answer = await admin.drain_broker(broker, timeout_s=timeout_s)
        except (ServerError, Timeout) as e:
            failed[broker] = str(e)
            continue
        left = answer.get("failed") or {}
        failed[broker] = "; ".join(f"{k}: {v}" for k, v in list(left.items())[:NAMED])
    return failed
