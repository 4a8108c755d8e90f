"""Re-replication of closed ledgers that lost copies, or were made on too few nodes.

BookKeeper splits this in two: an auditor (one elected bookie) notices lost bookies and
marks their ledgers under-replicated, and replication workers copy each marked ledger to
a live bookie and swap the copy into the ledger's metadata. Here both are one small step
run by the *owner* of the managed ledger (the broker serving its topic or holding its v4
log open, the coordinator holding a v4 transaction log's id: no leader to elect, and its
placement change is one more compare-and-set in the order of the owner's own):
:class:`Census` says, from the registered storage nodes alone, which closed ledgers are
short of copies, and :func:`repair_ledger` repairs one. When and how often is the owner's
loop's business (:mod:`segtxn.topics.repairs`).

A copy a closed ledger's placement names is

- **alive**: its broker is registered with that instance;
- **lost**: its broker is registered with another instance (it came back on an empty
  disk), or has been unregistered for ``lost_after_s`` or more (gone for good: scaled
  away, its volume deleted); or it is alive but its file is gone;
- **away**: unregistered for less than that (restarting): it is neither copied nor
  dropped, since it may well come back.

A ledger is short when its alive and away copies are fewer than the write quorum ``W``: it
lost some, or it was made on fewer nodes because fewer were alive (it is widened to ``W``
once enough are). A ledger whose copies are all alive may still be *behind*: a copy that
fell out of the ensemble while the ledger was written (its node paused, or cut off, past
the replication timeout while the ack quorum went on) holds a prefix only, and nothing in
the registrations says so; only asking the copies does (the owner's loop audits each
closed ledger once this way, with this same step). Repair:

1. asks each alive copy what it holds (``stat``, changing nothing). One holding fewer
   entries than the ledger's recorded count is topped up from a complete one (with
   recovery appends, which pass its fence; nothing in the metadata changes, so no
   compare-and-set is needed); if no complete copy answers, nothing is done now. A ledger
   that needs no new copy ends here: :attr:`Outcome.WHOLE` if every copy answered
   complete, :attr:`Outcome.REPAIRED` if the ones behind were topped up.
2. copies the ledger to live nodes of brokers that hold none of its kept copies (draining
   ones excluded), until it has ``W``: each copy starts with ``create`` (which refuses a
   replica that already holds anything), each batch is synced by the node before it
   answers, and the count is checked at the end. A copy is complete and durable before
   anything names it.
3. records the new placement (the lost copies out, the new ones in) through the owner's
   :meth:`ManagedLedger.move_ledger`: one compare-and-set, taken in turn with the owner's
   rollovers and trims, and only if the ledger is still closed and kept where it was.
   A repair that loses (the ledger was trimmed, or moved by another repair, or another
   broker took the topic over and recovered it, which fences this owner's writes) changes
   nothing. Its copies are left to the node-side sweep (:mod:`segtxn.ledger.replicas.sweep`)
   and never deleted here: a racing repairer may have put its winning copy on the same
   node. A repair slower than ``commit_within_s`` gives up before its compare-and-set, so
   no copy is named after the sweep's grace period could have taken it for garbage.

Lost copies leave a placement only when new copies are made in the same change: with no
node to copy to, the ledger stays as it is (and is counted as under-replicated).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from segtxn.ledger.errors import (
    LedgerClosed,
    LedgerCorrupted,
    LedgerError,
    LedgerFenced,
    LedgerMissing,
)
from segtxn.ledger.logs import Placement
from segtxn.ledger.managed import ManagedLedger
from segtxn.ledger.metadata import LedgerInfo
from segtxn.ledger.replicas.members import Member, Nodes, Replica
from segtxn.ledger.replicas.node import ReplicaFenced
from segtxn.ledger.replicas.storage import copy_entries

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RepairSettings:
    """When a broker checks and repairs its ledgers, and sweeps its storage node."""

    check_s: float = 30.0
    """How often the ledgers of the topics loaded here are checked (in memory)."""
    full_check_s: float = 600.0
    """How often the topics homed here but not loaded are checked too (a store read
    each); also whenever the registered storage nodes change."""
    members_check_s: float = 5.0
    """How often the registered storage nodes are listed, to notice a change."""
    lost_after_s: float = 300.0
    """How long a broker may stay unregistered before its copies are taken for lost."""
    max_copies: int = 2
    """Ledgers repaired at once by one broker (each copies one batch at a time)."""
    audits_per_check: int = 1000
    """Closed ledgers whose copies are all registered asked what they hold, at most, per
    check (each once, to find a copy that fell behind; the rest at the next checks)."""
    sweep_s: float = 600.0
    """How often the storage node looks for replicas no placement names."""
    sweep_grace_s: float = 3600.0
    """How long such a replica must have been left alone before the sweep removes it."""

    def __post_init__(self) -> None:
        times = (self.check_s, self.full_check_s, self.members_check_s, self.sweep_s)
        if min(times) <= 0 or self.lost_after_s < 0 or self.sweep_grace_s <= 0:
            raise ValueError("repair intervals and the sweep's grace must be positive")
        if self.max_copies < 1 or self.audits_per_check < 0:
            raise ValueError("max_copies must be at least 1, audits_per_check at least 0")

    @property
    def commit_within_s(self) -> float:
        """The longest a repair may take before it records its copies: half the sweep's
        grace, so a copy is named long before the sweep could take it for garbage."""
        return self.sweep_grace_s / 2


class CopyState(enum.Enum):
    ALIVE = "alive"
    AWAY = "away"
    LOST = "lost"


class Outcome(enum.Enum):
    WHOLE = "whole"
    """Every copy is alive, answered, and holds the whole ledger: nothing was done."""
    REPAIRED = "repaired"
    """Copies were made and the new placement recorded, or the copies behind were topped
    up (every copy now holds the whole ledger)."""
    LOST_RACE = "lost race"
    """The ledger changed meanwhile (trimmed, moved, another owner): nothing recorded."""
    NOT_NOW = "not now"
    """No complete copy answered, a copy did not answer or could not be topped up, no
    node took a copy, or it took too long: try later."""


@dataclass(frozen=True)
class Census:
    """The storage nodes as a repairer sees them at one moment."""

    registered: Mapping[str, str]
    """Each registered broker's storage-node instance."""
    gone: frozenset[str]
    """Brokers unregistered for ``lost_after_s`` or more."""
    targets: tuple[Member, ...]
    """The registered nodes that may take new copies (not draining)."""

    def state(self, member: Member) -> CopyState:
        instance = self.registered.get(member.broker)
        if instance == member.instance:
            return CopyState.ALIVE
        if instance is not None or member.broker in self.gone:
            return CopyState.LOST
        return CopyState.AWAY

    def wanted(self, info: LedgerInfo, write_quorum: int) -> int:
        """How many copies the closed, replicated ledger ``info`` lacks and could get now
        (0 for an open or unreplicated ledger, and when no node could take one)."""
        if info.entries is None or not info.replicas:
            return 0
        kept = [m for m in map(Member.parse, info.replicas) if self.state(m) is not CopyState.LOST]
        if len(kept) >= write_quorum or not self.targets_for(kept):
            return 0
        return write_quorum - len(kept)

    def short(self, info: LedgerInfo, write_quorum: int) -> bool:
        """Whether the closed, replicated ledger ``info`` has fewer than ``write_quorum``
        alive copies (what the under-replicated gauge counts)."""
        if info.entries is None or not info.replicas:
            return False
        alive = [m for m in map(Member.parse, info.replicas) if self.state(m) is CopyState.ALIVE]
        return len(alive) < write_quorum

    def targets_for(self, kept: Sequence[Member]) -> list[Member]:
        """Nodes that may take a copy of a ledger keeping ``kept``: of other brokers."""
        holders = {m.broker for m in kept}
        return [t for t in self.targets if t.broker not in holders]


async def repair_ledger(
    ledger: ManagedLedger,
    info: LedgerInfo,
    census: Census,
    nodes: Nodes,
    *,
    write_quorum: int,
    commit_within_s: float,
) -> Outcome:
    """Bring the closed ledger ``info`` of ``ledger`` (held open by this owner) back to
    ``write_quorum`` complete copies, as the module docstring says. Logs what it did (INFO
    per repair, WARNING when it cannot); copies of a repair that does not record them are
    left to the sweep.

    Raises:
        ValueError: ``info`` is not a closed, replicated ledger.
    """
    if info.entries is None or not info.replicas:
        raise ValueError(f"ledger {info.id} of {ledger.name} is open or not replicated")
    loop = asyncio.get_running_loop()
    started = loop.time()
    name, entries = ledger.name, info.entries
    what = f"ledger {info.id} of {name}"
    members = [Member.parse(m) for m in info.replicas]
    lost = [m for m in members if census.state(m) is CopyState.LOST]
    alive = [m for m in members if census.state(m) is CopyState.ALIVE]
    complete, behind, missing = await _ask([nodes.replica(m) for m in alive], name, info)
    lost += missing
    if not complete:
        log.warning("%s: no complete copy answers (%s); it is repaired later", what, behind)
        return Outcome.NOT_NOW
    sources = _local_first([nodes.replica(m) for m in complete], nodes.local)
    whole = list(complete)
    for member, count in behind:
        if await _top_up(sources, nodes.replica(member), name, info.id, count=count, end=entries):
            whole.append(member)
    kept = [m for m in members if m not in lost]
    if len(kept) >= write_quorum:  # no new copy wanted: were the kept ones all whole?
        unverified = [m for m in kept if m not in whole]
        if unverified:
            log.info(
                "%s: its copies on %s are not known whole yet (away, silent, or not topped "
                "up); checked again later",
                what,
                ", ".join(map(str, unverified)),
            )
            return Outcome.NOT_NOW
        return Outcome.REPAIRED if behind else Outcome.WHOLE
    targets = census.targets_for(kept)
    random.shuffle(targets)
    made: list[Member] = []
    for target in targets:
        if len(kept) + len(made) >= write_quorum:
            break
        if await _copy_to(nodes.replica(target), sources, name, info.id, entries):
            made.append(target)
    if not made:
        log.warning("%s: short of copies, and no node took a new one; tried later", what)
        return Outcome.NOT_NOW
    if loop.time() - started > commit_within_s:
        log.warning(
            "%s: its copies took over %.0f s; not recorded (the sweep removes them)",
            what,
            commit_within_s,
        )
        return Outcome.NOT_NOW
    now = Placement(tuple(str(m) for m in [*kept, *made]), info.ack_quorum)
    try:
        moved = await ledger.move_ledger(info.id, info.placement, now)
    except (LedgerFenced, LedgerClosed) as e:
        log.info("%s: repair not recorded, the ledger changed hands (%s)", what, e)
        return Outcome.LOST_RACE
    if not moved:
        log.info("%s: repair not recorded, the ledger was trimmed or moved meanwhile", what)
        return Outcome.LOST_RACE
    log.info(
        "%s: re-replicated, %d entries copied to %s in %.1f s (lost: %s); now on %s",
        what,
        entries,
        ", ".join(map(str, made)),
        loop.time() - started,
        ", ".join(map(str, lost)) or "none",
        ", ".join(now.replicas),
    )
    return Outcome.REPAIRED


async def _ask(
    replicas: Sequence[Replica], name: str, info: LedgerInfo
) -> tuple[list[Member], list[tuple[Member, int]], list[Member]]:
    """Ask the alive copies what they hold: returns the complete ones, those behind (with
    their counts), and those whose file is gone. One that does not answer is in none (it
    is neither a source nor lost)."""
    entries = info.entries or 0
    answers = await asyncio.gather(
        *(r.stat(name, info.id) for r in replicas), return_exceptions=True
    )
    complete: list[Member] = []
    behind: list[tuple[Member, int]] = []
    missing: list[Member] = []
    for replica, answer in zip(replicas, answers, strict=True):
        if isinstance(answer, BaseException):
            if not isinstance(answer, Exception):
                raise answer
            if isinstance(answer, LedgerMissing | LedgerCorrupted):  # damaged: as good as lost
                missing.append(replica.member)
        elif answer[0] >= entries:
            complete.append(replica.member)
        else:
            behind.append((replica.member, answer[0]))
    return complete, behind, missing


async def _top_up(
    sources: Sequence[Replica], target: Replica, name: str, ledger_id: int, *, count: int, end: int
) -> bool:
    """Give ``target`` (holding ``count`` entries) the rest of the ledger; False (logged)
    if it fails or still holds fewer than ``end`` after."""
    where = f"ledger {ledger_id} of {name}"
    try:
        held = await copy_entries(sources, target, name, ledger_id, start=count, end=end)
        if held < end:
            raise LedgerError(f"it holds {held} entries after the copy, not {end}")
    except LedgerError as e:
        log.warning("%s: topping up its copy on %s failed: %s", where, target.member, e)
        return False
    log.info("%s: topped up its copy on %s (%d..%d)", where, target.member, count, end)
    return True


async def _copy_to(
    target: Replica, sources: Sequence[Replica], name: str, ledger_id: int, entries: int
) -> bool:
    """Make a complete copy on ``target``; False (logged) if it fails. A target that a
    recovery fenced (its copy lost since, the fence left) takes the copy all the same: the
    ledger is closed, and recovery appends pass a fence. Refused, a lost copy of every
    ledger a crash or a take-over closed could not be made again on its own live node."""
    try:
        with contextlib.suppress(ReplicaFenced):  # (the copy's recovery appends make it)
            await target.create(name, ledger_id)
        count = await copy_entries(sources, target, name, ledger_id, start=0, end=entries)
        if count != entries:
            raise LedgerError(f"it holds {count} entries after the copy, not {entries}")
    except LedgerError as e:
        where = f"ledger {ledger_id} of {name}"
        log.warning("%s: copying it to %s failed: %s", where, target.member, e)
        return False
    return True


def _local_first(replicas: Sequence[Replica], local: Member | None) -> list[Replica]:
    return sorted(replicas, key=lambda r: r.member != local)
