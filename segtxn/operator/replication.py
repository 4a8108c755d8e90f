"""Replicated ledgers on Kubernetes: a SegtxnCluster's ``spec.brokers.replication``, what
it renders, what the operator refuses, and the brokers' disruption budget.

``spec.brokers.replication: "W/A"`` (e.g. ``"3/2"``) starts every broker with
``--replication W/A`` (:mod:`segtxn.broker.replication`): each broker is also a storage
node, each *new* ledger goes to ``W`` brokers and an entry is acknowledged once ``A`` have
it. The rules are the broker's own (:class:`segtxn.broker.settings.Replication`, parsed
here with its parser): ``1 <= A <= W`` and ``2A <= W + 1``; the cluster adds
``W <= spec.brokers.replicas`` (a ledger cannot go to more brokers than there are). The CRD
enforces the same (a pattern, :data:`PATTERN`, and CEL rules); :func:`wanted` is the
operator's own check, for API servers that do not run the rules.

Absent, the brokers run exactly as before: nothing of it is rendered (no ConfigMap key, no
flag), so an operator upgrade does not roll the brokers of a cluster without it.

**Changing it.** Turning it on later is safe: only ledgers created from then on are
replicated, the older ones stay on their broker's disk and are served as before. Changing
``W/A`` while on is safe too: each ledger records its own replicas and ack quorum in its
metadata, and recovery uses those. Turning it *off* is refused (:func:`turned_off`,
reported by :mod:`.immutable` as ``ImmutableField``): a broker without ``--replication``
reads only its own ledger files, so every replicated ledger (its topics included) would
become unreadable. What counts as on is what is applied: the ConfigMap the live broker
StatefulSet's pods read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from segtxn.ledger.replicas import Replication

FIELD = "spec.brokers.replication"
CONFIG_KEY = "replication"
"""The brokers' ConfigMap key holding ``W/A``; present only when replication is on."""
REPAIR_KEY = "repairIntervalSeconds"
"""The brokers' ConfigMap key for ``spec.brokers.settings.repairIntervalSeconds`` (their
``--repair-interval``: how often each checks and repairs its closed ledgers); present only
when replication is on and the setting is given, so it rolls nothing otherwise."""
PATTERN = r"^[1-9][0-9]?/[1-9][0-9]?$"
"""What the CRD accepts (a pattern cannot say ``A <= W``: :func:`wanted` and the CEL rule
do)."""


class InvalidReplication(ValueError):
    """``spec.brokers.replication`` is not a ``W/A`` this cluster can run; the message says
    why and what would do."""


def text(spec: Mapping[str, Any]) -> str | None:
    """``spec.brokers.replication`` as written, or None when absent or empty (off). Not
    checked: rendering a refused spec must not fail (the status timer renders it too)."""
    value = (spec.get("brokers") or {}).get("replication")
    if value is None:
        return None
    return str(value).strip() or None


def parse(spec: Mapping[str, Any]) -> Replication | None:
    """The replication ``spec`` asks for, None when off, checked on its own (not against
    the broker count: :func:`wanted`).

    Raises:
        InvalidReplication: not ``W/A`` (:data:`PATTERN`), or quorums the brokers refuse
            (``A > W`` or ``2A > W + 1``).
    """
    written = text(spec)
    if written is None:
        return None
    if not re.fullmatch(PATTERN, written):
        raise InvalidReplication(f"{FIELD} {written!r}: write it W/A, e.g. 3/2")
    try:
        return Replication.parse(written)
    except ValueError as e:
        raise InvalidReplication(f"{FIELD}: {e}") from e


def wanted(spec: Mapping[str, Any]) -> Replication | None:
    """:func:`parse`, and ``W`` at most ``spec.brokers.replicas``.

    Raises:
        InvalidReplication: as :func:`parse`, or ``W`` above ``spec.brokers.replicas``.
    """
    parsed = parse(spec)
    brokers = int((spec.get("brokers") or {}).get("replicas", 3))
    if parsed is not None and parsed.write_quorum > brokers:
        raise InvalidReplication(
            f"{FIELD} {parsed} writes each ledger on {parsed.write_quorum} brokers, but "
            f"spec.brokers.replicas is {brokers}: raise replicas to at least "
            f"{parsed.write_quorum}, or lower W"
        )
    return parsed


def config_data(spec: Mapping[str, Any]) -> dict[str, str]:
    """The brokers' ConfigMap entries for ``spec``'s replication: ``{"replication": "W/A"}``
    (and :data:`REPAIR_KEY` when that setting is given), or nothing when off (the ConfigMap,
    its name and the pods' template then stay what they were before replication existed)."""
    written = text(spec)
    if written is None:
        return {}
    repair = ((spec.get("brokers") or {}).get("settings") or {}).get(REPAIR_KEY)
    return {CONFIG_KEY: written, **({} if repair is None else {REPAIR_KEY: str(repair)})}


def applied(config: Mapping[str, Any] | None) -> str | None:
    """The ``W/A`` the brokers were started with, from the data of the ConfigMap the live
    StatefulSet's pods read; None when off (or nothing is applied yet)."""
    value = (config or {}).get(CONFIG_KEY)
    return str(value) if value else None


def turned_off(config: Mapping[str, Any] | None, spec: Mapping[str, Any]) -> str | None:
    """The ``W/A`` that runs when ``spec`` turns replication off, else None (on to on,
    with any ``W/A``, and off to on are allowed)."""
    running = applied(config)
    return running if running is not None and text(spec) is None else None


def max_unavailable(replication: Replication | None) -> int:
    """The brokers' PodDisruptionBudget ``maxUnavailable``: how many brokers a voluntary
    disruption (a node drain, an eviction) may take down at once. It is 1 with or without
    replication, for every valid ``W/A``; this is why.

    With ``W/A``, ``k`` brokers down leave a ledger whose ``W`` replicas include all ``k``
    with ``W - k`` replicas. New entries need ``A`` of them (``k <= W - A``); recovering
    the ledger after its writer stopped, which a take-over needs, must fence
    ``W - A + 1`` of them (``k <= A - 1``). So ``k = min(W - A, A - 1)`` keeps every
    replicated ledger writable and recoverable: 1 for ``3/2``, 2 for ``5/3``, 0 for
    ``2/1`` and ``1/1``.

    - Never more than 1. Ledgers written before replication was turned on live on one
      broker only (a second broker down is a second set of unreachable topics), a
      ledger created while fewer than ``W`` brokers were alive has fewer replicas
      (down to ``A``), and the StatefulSet replaces brokers one at a time anyway. So
      ``5/3`` gets 1 too, though its quorums would survive 2.
    - Never 0, even where the arithmetic says 0 (``2/1``, ``1/1``): a budget of 0
      blocks every node drain for ever. With one broker down, a ledger with a replica
      on it cannot be recovered until it returns (its volume comes back with it: nothing
      is lost), so its topic waits, exactly as without replication, where the evicted
      broker's topics wait for it.

    That is the rule ``min(1, W - A) if W - A >= 1 else 1``: for every ``W/A`` the
    brokers accept it is 1, and with ``3/2`` one broker may be down voluntarily while
    every replicated ledger keeps its write and recovery quorums.
    """
    del replication  # the same for every W/A: see above
    return 1


def broker_budget(spec: Mapping[str, Any]) -> int:
    """The brokers' PodDisruptionBudget ``maxUnavailable`` for ``spec``
    (:func:`max_unavailable`). A replication the operator refuses gets the budget of no
    replication (that spec is not applied anyway; rendering it must not fail)."""
    try:
        return max_unavailable(wanted(spec))
    except InvalidReplication:
        return max_unavailable(None)
