"""Replicated entry-log storage: each ledger on an ensemble of storage nodes.

A new ledger is created on ``write_quorum`` live nodes (this broker's own node first), and
its ensemble goes into the ledger's metadata (``LedgerInfo.replicas``, with the ack
quorum). With fewer nodes alive it goes on as many as there are, but never on fewer than
the ack quorum: each entry still waits for ``ack_quorum`` of them (durability is kept,
and one more loss stops writes until a node returns; Kafka's ``min.insync.replicas`` makes
the same trade). Writing is :mod:`segtxn.ledger.replicas.quorum`. A create that fails
(fewer nodes than the ack quorum took it, or the store refused the record that was to name
it: :meth:`ReplicatedLogStorage.discard`) discards the empty replicas it made, each for its
own claim only, best effort; each node's sweep (:mod:`segtxn.ledger.replicas.sweep`)
removes those left.

**Recovery** of a ledger whose writer stopped (crashed, killed, paused, or alive but
replaced) is BookKeeper's protocol, without ensemble changes:

1. *Fence* every replica. Each fenced replica answers with the count it holds at that
   moment, and from then on refuses the old writer. Once ``W - A + 1`` have answered
   (``W`` replicas, ack quorum ``A``), fewer than ``A`` are unfenced, so the old writer
   can no longer get any entry acknowledged; and every entry it did get acknowledged is
   on ``A`` replicas, so on at least one of those that answered. Recovery only uses
   counts from fenced replicas (apache/bookkeeper#2614 is what goes wrong otherwise),
   and never from one that no longer has its file: it is fenced, and gets the copy of
   step 3, but it does not answer (#2908: a lost replica taken for an empty one).
2. The ledger ends at the highest count answered: every acknowledged entry is before it
   (entries past the last acknowledged one may be kept too: their writer never heard
   back, and a producer resends them, which de-duplication absorbs).
3. Copy the entries up to that end to every answering replica that holds fewer (a
   recovery append passes the fence), so at least ``A`` replicas hold all of them before
   the managed ledger records the count (one compare-and-set, which fences a competing
   recovery).

``2A <= W + 1`` is required so that the ``W - A + 1`` fenced replicas can hold the ``A``
copies (a ledger created on fewer nodes needs more of them to answer its recovery).
Ledgers without replicas in their metadata (written before replication was turned on) are
served by the ``local`` storage, as before.

Its blocking calls run coroutines on the loop it was constructed on, or started on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from segtxn.ledger.errors import LedgerError, LedgerMissing, NotEnoughReplicas
from segtxn.ledger.logs import LOCAL, EntryLog, LogStorage, Placement, Recovered
from segtxn.ledger.replicas.members import NO_CLAIM, Member, Nodes, Replica
from segtxn.ledger.replicas.policy import check_quorums
from segtxn.ledger.replicas.quorum import ReplicatedLog, blocking

log = logging.getLogger(__name__)

COPY_BATCH = 500
"""Entries one recovery (or repair) read and append carry at most."""
LEDGER_IO_THREADS = 64
"""The event loop's default executor with replication: each replicated append, read or
recovery holds one of its threads for a network round trip (the managed ledger calls
storage from threads), and aiohttp resolves host names there too; the default
(cores + 4) would let a handful of slow replicas starve every other ledger."""


def widen_default_executor() -> None:
    """Give the running loop a default executor of :data:`LEDGER_IO_THREADS` threads (a
    process writing replicated ledgers calls this once, at start-up)."""
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(LEDGER_IO_THREADS, thread_name_prefix="ledger-io")
    )


class ReplicatedLogStorage(LogStorage):
    def __init__(
        self, nodes: Nodes, local: LogStorage, *, write_quorum: int, ack_quorum: int
    ) -> None:
        """Raises ValueError: quorums that recovery cannot work with."""
        check_quorums(write_quorum, ack_quorum)
        self.nodes = nodes
        self.local = local
        self.write_quorum = write_quorum
        self.ack_quorum = ack_quorum
        self._running: asyncio.AbstractEventLoop | None = None
        with contextlib.suppress(RuntimeError):
            self._running = asyncio.get_running_loop()

    async def start(self) -> None:
        """Bind to the running loop (for storage constructed outside one)."""
        self._running = asyncio.get_running_loop()

    @property
    def _loop(self) -> asyncio.AbstractEventLoop:
        if self._running is None:
            raise RuntimeError("replicated storage used before start()")
        return self._running

    def where(self, ledger_name: str, ledger_id: int) -> str:
        return self.local.where(ledger_name, ledger_id)

    def exists(self, ledger_name: str, ledger_id: int) -> bool:
        return self.local.exists(ledger_name, ledger_id)

    # ------------------------------------------------------------------ create

    def create(self, ledger_name: str, ledger_id: int) -> ReplicatedLog:
        return blocking(self._loop, self._create(ledger_name, ledger_id))

    async def _create(self, name: str, ledger_id: int) -> ReplicatedLog:
        alive = await self.nodes.alive()
        local = self.nodes.local
        others = [m for m in alive if m != local]
        random.shuffle(others)
        candidates = ([local] if local in alive else []) + others
        chosen: list[Replica] = []
        claims: list[tuple[Replica, int]] = []
        problems: list[str] = []
        while candidates and len(chosen) < self.write_quorum:
            batch = candidates[: self.write_quorum - len(chosen)]
            del candidates[: len(batch)]
            replicas = [self.nodes.replica(m) for m in batch]
            results = await asyncio.gather(
                *(r.create(name, ledger_id) for r in replicas), return_exceptions=True
            )
            for replica, result in zip(replicas, results, strict=True):
                if isinstance(result, BaseException):
                    if not isinstance(result, Exception):
                        raise result
                    problems.append(f"{replica.member}: {result}")
                else:
                    chosen.append(replica)
                    claims.append((replica, result))
        if len(chosen) < self.ack_quorum:
            await _discard(name, ledger_id, claims)
            raise NotEnoughReplicas(
                f"ledger {ledger_id} of {name} needs at least {self.ack_quorum} storage "
                f"nodes (the ack quorum; {self.write_quorum} to be whole); {len(chosen)} of "
                f"the {len(alive)} alive took it"
                + (f" ({'; '.join(problems)})" if problems else "")
            )
        created = ReplicatedLog(
            name, ledger_id, chosen, ack_quorum=self.ack_quorum, loop=self._loop, writable=True
        )
        created.claims = claims
        if len(chosen) < self.write_quorum:
            log.warning(
                "ledger %d of %s: created on %d storage nodes, not %d (too few alive); "
                "each entry still waits for %d, and the next ledger starts once %d are alive",
                ledger_id,
                name,
                len(chosen),
                self.write_quorum,
                self.ack_quorum,
                self.write_quorum,
            )
            created.short_of(self.write_quorum, self._count_alive)
        return created

    async def _count_alive(self) -> int:
        return len(await self.nodes.alive())

    # ------------------------------------------------------------------ recover

    def recover(
        self,
        ledger_name: str,
        ledger_id: int,
        *,
        log_format: int,
        tail_bytes: int,
        placement: Placement = LOCAL,
        nonce: int | None = None,
    ) -> Recovered:
        """``nonce`` is checked for a ledger kept locally only (a replicated one records
        none: its copies are named by their nodes' instances)."""
        if not placement.replicas:
            return self.local.recover(
                ledger_name, ledger_id, log_format=log_format, tail_bytes=tail_bytes, nonce=nonce
            )
        recovered = blocking(self._loop, self._recover(ledger_name, ledger_id, placement))
        return Recovered(recovered, None)

    async def _recover(self, name: str, ledger_id: int, placement: Placement) -> ReplicatedLog:
        replicas = self._replicas(placement)
        needed = len(replicas) - placement.ack_quorum + 1
        results = await asyncio.gather(
            *(r.fence(name, ledger_id) for r in replicas), return_exceptions=True
        )
        fenced: list[tuple[Replica, int, int]] = []
        emptied: list[Replica] = []  # fenced, but without the replica: it vouches for nothing
        problems: list[str] = []
        for replica, result in zip(replicas, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                if isinstance(result, LedgerMissing):
                    emptied.append(replica)
                problems.append(f"{replica.member}: {result}")
            else:
                fenced.append((replica, *result))
        what = f"ledger {ledger_id} of {name}"
        if len(fenced) < needed:
            raise NotEnoughReplicas(
                f"{what}: recovery needs {needed} of its {len(replicas)} replicas fenced; "
                f"{len(fenced)} answered ({'; '.join(problems)})"
            )
        end = max(count for _, count, _ in fenced)
        source = next(r for r, count, _ in fenced if count == end)
        holders = [r for r, count, _ in fenced if count == end]
        for replica, count, _ in [*fenced, *((r, 0, 0) for r in emptied)]:
            if count < end:
                try:
                    await copy_entries([source], replica, name, ledger_id, start=count, end=end)
                    holders.append(replica)
                except LedgerError as e:
                    problems.append(f"{replica.member}: copying entries {count}..: {e}")
        if len(holders) < placement.ack_quorum:  # copies were lost: make new ones
            holders += await self._replace(
                name,
                ledger_id,
                source,
                end=end,
                placement=placement,
                wanted=placement.ack_quorum - len(holders),
            )
            placement = Placement(tuple(str(r.member) for r in holders), placement.ack_quorum)
            log.warning("%s: its copies now live on %s", what, ", ".join(placement.replicas))
        if len(holders) < placement.ack_quorum:
            raise NotEnoughReplicas(
                f"{what}: {len(holders)} replicas hold its {end} entries after recovery; it "
                f"needs {placement.ack_quorum} ({'; '.join(problems)})"
            )
        if problems:
            log.warning("%s: recovered at %d entries; %s", what, end, "; ".join(problems))
        size = max(size for r, _, size in fenced if r in holders)
        return self._closed(name, ledger_id, holders, placement, count=end, size=size)

    def _closed(
        self,
        name: str,
        ledger_id: int,
        replicas: Sequence[Replica],
        placement: Placement,
        *,
        count: int,
        size: int = 0,
    ) -> ReplicatedLog:
        """A closed ledger to read, from ``replicas`` (this broker's own first)."""
        return ReplicatedLog(
            name,
            ledger_id,
            self._local_first(replicas),
            ack_quorum=placement.ack_quorum,
            loop=self._loop,
            count=count,
            size=size,
            writable=False,
            placement=placement,
        )

    async def _replace(
        self,
        name: str,
        ledger_id: int,
        source: Replica,
        *,
        end: int,
        placement: Placement,
        wanted: int,
    ) -> list[Replica]:
        """Copy the recovered ledger (``end`` entries, from ``source``) to up to ``wanted``
        live nodes outside its placement: its replicas that answered hold fewer copies
        than its ack quorum (the others are gone, e.g. a node that came back empty is a
        new instance). The ledger is closed, so its placement may change; the managed
        ledger records the new one with the count."""
        made: list[Replica] = []
        for member in await self.nodes.alive():
            if len(made) == wanted:
                break
            if str(member) in placement.replicas:
                continue
            replica = self.nodes.replica(member)
            try:
                await replica.create(name, ledger_id)
                await copy_entries([source], replica, name, ledger_id, start=0, end=end)
            except LedgerError as e:
                log.warning(
                    "ledger %d of %s: copying it to %s failed: %s", ledger_id, name, member, e
                )
                continue
            made.append(replica)
        return made

    # ------------------------------------------------------------------ open, delete

    def open(
        self,
        ledger_name: str,
        ledger_id: int,
        *,
        log_format: int,
        entries: int,
        size_bytes: int | None = None,
        placement: Placement = LOCAL,
        nonce: int | None = None,
    ) -> EntryLog:
        if not placement.replicas:
            return self.local.open(
                ledger_name,
                ledger_id,
                log_format=log_format,
                entries=entries,
                size_bytes=size_bytes,
                nonce=nonce,
            )
        return self._closed(
            ledger_name, ledger_id, self._replicas(placement), placement, count=entries
        )

    def verify_identity(self, ledger_name: str, ledger_id: int, nonce: int | None) -> None:
        """(Only a ledger kept locally records a nonce.)"""
        self.local.verify_identity(ledger_name, ledger_id, nonce)

    def delete(self, ledger_name: str, ledger_id: int, placement: Placement = LOCAL) -> None:
        if not placement.replicas:
            self.local.delete(ledger_name, ledger_id)
            return
        blocking(self._loop, _delete_all(self._replicas(placement), ledger_name, ledger_id))

    def delete_unused(self, ledger_name: str, ledger_id: int) -> bool:
        """(A ledger of this broker's own storage, made before replication: a replicated
        create whose record failed has its replicas discarded, or swept.)"""
        return self.local.delete_unused(ledger_name, ledger_id)

    def discard(self, ledger_name: str, entry_log: EntryLog) -> bool:
        """(See :meth:`LogStorage.discard`.) A replicated log's replicas are each removed
        by its node for this create's claim only (:meth:`ReplicaNode.discard`: never one
        another create made its own, nor one in use); the others are left to their
        nodes' sweeps. True: all were removed."""
        if not isinstance(entry_log, ReplicatedLog):
            return self.local.discard(ledger_name, entry_log)
        entry_log.close()
        return blocking(self._loop, _discard(ledger_name, entry_log.ledger_id, entry_log.claims))

    def _replicas(self, placement: Placement) -> list[Replica]:
        return self._local_first([self.nodes.replica(Member.parse(m)) for m in placement.replicas])

    def _local_first(self, replicas: Sequence[Replica]) -> list[Replica]:
        return sorted(replicas, key=lambda r: r.member != self.nodes.local)


async def copy_entries(
    sources: Sequence[Replica], target: Replica, name: str, ledger_id: int, *, start: int, end: int
) -> int:
    """Give ``target`` entries ``start..end-1``, read from the first of ``sources`` that
    serves each piece (recovery appends: they pass a fence, and each is synced before the
    target answers). Returns the count the target holds afterwards.

    Raises:
        LedgerError: the target refused a piece, or no source served one.
    """
    first = start
    count = start
    while first < end:
        last = min(end, first + COPY_BATCH) - 1
        payloads = await _read_any(sources, name, ledger_id, first, last)  # (maybe fewer)
        count = await target.append(name, ledger_id, first, payloads, recovery=True)
        first += len(payloads)
    return count


async def _read_any(
    sources: Sequence[Replica], name: str, ledger_id: int, first: int, last: int
) -> list[bytes]:
    problems: list[str] = []
    for source in sources:
        try:
            return await source.read(name, ledger_id, first, last)
        except LedgerError as e:
            problems.append(f"{source.member}: {e}")
    raise NotEnoughReplicas(
        f"ledger {ledger_id} of {name}: no copy served entries {first}..{last} "
        f"({'; '.join(problems) or 'no copy to read'})"
    )


async def _discard(name: str, ledger_id: int, claims: Sequence[tuple[Replica, int]]) -> bool:
    """Discard the empty replicas a failed create made (each with the claim its create
    answered), best effort: a replica not removed (its node does not answer, or another
    create claimed it meanwhile) is left to its node's sweep. True: all were removed."""
    claimed = [(r, claim) for r, claim in claims if claim != NO_CLAIM]
    results = await asyncio.gather(
        *(r.discard(name, ledger_id, claim) for r, claim in claimed), return_exceptions=True
    )
    removed = 0
    for (replica, _), result in zip(claimed, results, strict=True):
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            raise result
        if isinstance(result, Exception):
            log.info(
                "ledger %d of %s: the empty replica of a failed create on %s is left to its "
                "node's sweep: %s",
                ledger_id,
                name,
                replica.member,
                result,
            )
        elif result:
            removed += 1
    return removed == len(claims)


async def _delete_all(replicas: Sequence[Replica], name: str, ledger_id: int) -> None:
    """Delete the ledger on each replica; one that does not answer keeps its copy (logged)."""
    results = await asyncio.gather(
        *(r.delete(name, ledger_id) for r in replicas), return_exceptions=True
    )
    for replica, result in zip(replicas, results, strict=True):
        if isinstance(result, Exception):
            log.warning(
                "ledger %d of %s: its replica on %s was not deleted: %s",
                ledger_id,
                name,
                replica.member,
                result,
            )
