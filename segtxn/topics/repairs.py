"""The background repair loop: one for every process that owns replicated managed ledgers.

Brokers own their topics' and segments' ledgers and their v4 logs (pending-ack logs,
transaction-buffer snapshot logs); a v4 coordinator owns the transaction logs of the ids it
holds. Each repairs the closed ledgers of what it owns itself
(:func:`~segtxn.ledger.replicas.repair_ledger`: new copies, recorded by the owner's own
compare-and-set), so a repair never fences or races the ledger's owner, and no leader is
elected. This module is the part they share: :class:`RepairLoop` lists the registered
storage nodes (the brokers, :class:`~segtxn.topics.catalog.Catalog`), keeps the clock of
the brokers seen unregistered (their copies are lost after ``lost_after_s``), checks what
its owner holds every ``check_s`` and whenever the storage nodes change (listed every
``members_check_s``), repairs at most ``max_copies`` ledgers at once, and keeps the count
of under-replicated ledgers for the owner's gauge.

**Copies that fell behind.** Registration says nothing of a copy that is alive but holds
only a prefix of its closed ledger (its node was paused or cut off past the replication
timeout while the ack quorum went on, and the writer moved to a new ledger without it).
So each closed ledger whose copies are all registered is *audited* once: the same repair
step asks every copy what it holds and tops up those behind. A ledger found whole is
remembered (by id and placement, for as long as it is held), so a check costs nothing for
it afterwards: a closed ledger never changes. (A named copy whose file is removed by hand
later, which nothing in segtxn does, is noticed when the ledger is audited again: its owner
let it go and opened it again, or its placement changed.) At most ``audits_per_check``
ledgers are audited per check (a broker that just started with many ledgers spreads them
out); one found behind and not topped up (or with a copy that did not answer) is audited
again at the next check, and counted as under-replicated until it is whole.

What the owner holds is a callable (``held``), read at each check: the loop never opens a
ledger itself (opening one recovers it, which fences its writer). A broker also loads the
topics it homes but has not loaded when a full check is due (``load_short``), and sweeps its
storage node (:class:`segtxn.broker.replication.Repairer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from segtxn.ledger import LedgerError, ManagedLedger
from segtxn.ledger.metadata import LedgerInfo
from segtxn.ledger.replicas import (
    Census,
    Member,
    Nodes,
    Outcome,
    RepairSettings,
    repair_ledger,
)
from segtxn.metastore import MetadataStoreError
from segtxn.topics.catalog import Catalog

log = logging.getLogger(__name__)

Held = Callable[[], Iterable[ManagedLedger]]
"""The managed ledgers the owner holds open now (and writes, or may write)."""
_Key = tuple[str, int, tuple[str, ...]]
"""A closed ledger as audited: its managed ledger, its id, its placement."""
LoadShort = Callable[[Census], Awaitable[None]]
"""At a full check, before the held ledgers are read: open what the owner owns but has not
opened and is short of copies (a broker loads such topics)."""


class RepairLoop:
    """Repairs the closed ledgers of what ``held`` returns (see the module docstring).
    :meth:`run` is its one long-lived task; ``owner`` names the process in its logs."""

    def __init__(
        self,
        catalog: Catalog,
        nodes: Nodes,
        *,
        write_quorum: int,
        settings: RepairSettings,
        held: Held,
        owner: str,
        load_short: LoadShort | None = None,
    ) -> None:
        self._catalog = catalog
        self._nodes = nodes
        self._write_quorum = write_quorum
        self.settings = settings
        self._held = held
        self._load_short = load_short
        self.owner = owner
        self._missing_since: dict[str, float] = {}
        """Brokers seen unregistered (a placement names them), since when (monotonic)."""
        self._seen: tuple[frozenset[tuple[str, str]], frozenset[str]] | None = None
        self._wake = asyncio.Event()
        self._full_due = True
        self._last_full = 0.0
        self._checking = asyncio.Lock()  # one round at a time: two would copy the same ledger
        self._audited: set[_Key] = set()
        """Closed ledgers (by placement) whose every copy answered whole: not asked again."""
        self._behind: set[_Key] = set()
        """Closed ledgers found with a copy behind (or silent) and not topped up yet."""
        self.under_replicated = 0
        """Closed ledgers held here with fewer than W copies on registered storage nodes,
        or with a copy found behind (or not answering) and not topped up, as of the last
        check (after its repairs)."""

    async def run(self) -> None:
        """Watch the storage nodes and check until cancelled (a failed round is logged
        and retried)."""
        async with asyncio.TaskGroup() as group:
            group.create_task(
                self.repeat("watching storage nodes", self._watch, self.settings.members_check_s),
                name="repair-members",
            )
            group.create_task(self._checks(), name="repair-checks")

    async def census(self) -> Census:
        """The storage nodes now (a broker's copies are lost once it has been seen
        unregistered for ``lost_after_s``)."""
        brokers = await self._catalog.brokers()
        registered = {b.broker_id: b.instance for b in brokers if b.instance}
        now = time.monotonic()
        for broker in registered:
            self._missing_since.pop(broker, None)
        if self._seen is not None:
            for broker, _ in self._seen[0]:
                if broker not in registered:
                    self._missing_since.setdefault(broker, now)
        lost_after = self.settings.lost_after_s
        return Census(
            registered=registered,
            gone=frozenset(b for b, t in self._missing_since.items() if now - t >= lost_after),
            targets=tuple(
                Member(b.broker_id, b.instance) for b in brokers if b.instance and not b.draining
            ),
        )

    async def check(self, *, full: bool) -> int:
        """One round: repair what is short among the ledgers held (``full``: let the owner
        open what it owns and is short first). Returns the ledgers repaired."""
        async with self._checking:
            return await self._check(full=full)

    async def _check(self, *, full: bool) -> int:
        census = await self.census()
        if full:
            self._last_full = time.monotonic()
            if self._load_short is not None:
                await self._load_short(census)
        short = 0
        repairs: list[tuple[ManagedLedger, LedgerInfo]] = []
        audits: list[tuple[ManagedLedger, LedgerInfo]] = []
        keys: set[_Key] = set()
        for ledger in list(self._held()):
            for info in ledger.ledgers:
                self.note_missing(info, census)
                if info.entries is None or not info.replicas:
                    continue
                key = (ledger.name, info.id, info.replicas)
                keys.add(key)
                if census.short(info, self._write_quorum):
                    short += 1
                    self._behind.discard(key)  # (counted as short now)
                    if census.wanted(info, self._write_quorum):
                        repairs.append((ledger, info))
                elif key in self._behind:  # (found behind before: asked again first)
                    audits.insert(0, (ledger, info))
                elif key not in self._audited:
                    audits.append((ledger, info))
        audits = audits[: max(self.settings.audits_per_check, len(self._behind & keys))]
        self._audited &= keys  # (forget the ledgers trimmed, moved or let go of)
        self._behind &= keys
        outcomes: list[tuple[Outcome, bool]] = []
        queue = iter([*((*r, True) for r in repairs), *((*a, False) for a in audits)])

        async def worker() -> None:  # (each takes the next repair from the shared queue)
            for ledger, info, was_short in queue:
                outcome = await self._repair(ledger, info, census)
                key = (ledger.name, info.id, info.replicas)
                if outcome in (Outcome.WHOLE, Outcome.REPAIRED):
                    self._audited.add(key)
                    self._behind.discard(key)
                elif outcome is Outcome.NOT_NOW and not was_short:
                    self._behind.add(key)
                outcomes.append((outcome, was_short))

        async with asyncio.TaskGroup() as group:
            for n in range(min(self.settings.max_copies, len(repairs) + len(audits))):
                group.create_task(worker(), name=f"repair-worker-{n}")
        repaired = sum(o is Outcome.REPAIRED for o, _ in outcomes)
        fixed = sum(o is Outcome.REPAIRED and was_short for o, was_short in outcomes)
        self.under_replicated = max(0, short - fixed) + len(self._behind)
        return repaired

    async def _repair(self, ledger: ManagedLedger, info: LedgerInfo, census: Census) -> Outcome:
        if ledger.is_closing or info not in ledger.ledgers:
            return Outcome.LOST_RACE  # let go of, or the ledger changed, meanwhile
        try:
            return await repair_ledger(
                ledger,
                info,
                census,
                self._nodes,
                write_quorum=self._write_quorum,
                commit_within_s=self.settings.commit_within_s,
            )
        except (LedgerError, MetadataStoreError) as e:
            log.warning("ledger %d of %s: repair failed: %s", info.id, ledger.name, e)
            return Outcome.NOT_NOW

    def note_missing(self, info: LedgerInfo, census: Census) -> None:
        """Start the clock of the unregistered brokers ``info``'s copies are on."""
        now = time.monotonic()
        for member in map(Member.parse, info.replicas):
            if member.broker not in census.registered:
                self._missing_since.setdefault(member.broker, now)

    async def _watch(self) -> None:
        """Wake a full check when the registered storage nodes change (or one is gone)."""
        census = await self.census()
        seen = (frozenset(census.registered.items()), census.gone)
        if seen != self._seen:
            self._seen = seen
            self._full_due = True
            self._wake.set()

    async def _checks(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.check_s):
                    await self._wake.wait()
            self._wake.clear()
            due = time.monotonic() - self._last_full >= self.settings.full_check_s
            full, self._full_due = self._full_due or due, False
            await self.step("a repair check", functools.partial(self.check, full=full))

    async def repeat(
        self, what: str, step: Callable[[], Awaitable[object]], every_s: float
    ) -> None:
        """Run ``step`` every ``every_s`` until cancelled (a failure is logged: :meth:`step`)."""
        while True:
            await asyncio.sleep(every_s)  # a schedule, not a wait
            await self.step(what, step)

    async def step(self, what: str, step: Callable[[], Awaitable[object]]) -> None:
        """Run ``step`` once; a failure is logged, never raised (the next round retries)."""
        try:
            await step()
        except MetadataStoreError as e:
            log.warning("%s: %s: the store failed (%s); tried again later", self.owner, what, e)
        except Exception:
            log.exception("%s: %s failed; tried again later", self.owner, what)
