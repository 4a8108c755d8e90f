"""A storage node: the replicas of ledgers that writers (brokers) keep here.

Each replica is an ordinary ledger file (:mod:`segtxn.ledger.files`) under the node's root,
so a node's crash model is the file storage's: what it acknowledged was synced and marked.
A replica only ever holds a *prefix* of its ledger: a batch is taken only if it starts at
the replica's count (:class:`ReplicaGap` otherwise), so the recovery in
:mod:`segtxn.ledger.replicas.recovery` can reason about counts alone.

**Fencing.** ``fence`` makes the replica refuse every later normal append, durably (a
``<id>.fenced`` file, synced with its directory, before it answers), and answers with
the count it holds at that moment. The fence and the count are taken under the same lock
as appends, so no append lands between them: a writer that a recovery fenced out can no
longer reach an ack quorum (BookKeeper's lesson from apache/bookkeeper#2614: the replica's
answer that recovery uses must come from a fenced replica). Recovery's own appends (copying
entries a quorum must hold before the ledger closes) pass the fence.

**Identity.** A node's root holds an ``.instance`` id, made when the root is new. An
ensemble names each replica as ``<broker id>@<instance>``, and a request for another
instance is refused (:class:`WrongInstance`): a node restarted on an empty disk is a new
instance, never a replica that silently lost what it acknowledged.

**Garbage.** A replica that no placement names any more (its deletion was missed while
this node was away, or it is the copy of a recovery or repair that lost its race) is
removed by :mod:`segtxn.ledger.replicas.sweep`, through :meth:`ReplicaNode.untouched` and
:meth:`ReplicaNode.remove_untouched`: only once it has been left alone for a grace
period, re-checked under its lock (any create, append or fence refreshes its files'
modification times). The empty replica of a create that failed (too few nodes took the
ledger, or the store refused the record that was to name it) is removed at once by
:meth:`ReplicaNode.discard`, for that create only: each create answers with a claim, and a
replica is discarded for its claim while no one else can use it (the sweep is the
backstop for the others).

Methods block (file I/O); :meth:`run` runs one on the node's own threads, so the threads
of writers waiting for a quorum can never starve the node's work. A lock per replica
exists only while the replica is open or an operation on it is under way (a node that
served millions of ledgers holds a lock for each of the few it has open, not for each).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar
from urllib.parse import unquote

from segtxn.ledger.errors import LedgerCorrupted, LedgerError, LedgerFenced, LedgerMissing
from segtxn.ledger.files import FileEntryLog, FileLogStorage, create_file, remove_if_empty
from segtxn.ledger.logs import EntryLog
from segtxn.ledger.records import FORMAT

T = TypeVar("T")

INSTANCE_FILE = ".instance"
MAX_OPEN = 512
"""Replicas a node holds open at most (about: one in use is never closed); the others are
opened again when they are next used."""
READ_BYTES = 4 << 20
"""About the most bytes one read answers with (one entry, however large, always goes)."""
CLAIM_LIMIT = 10**18
"""Claims (:meth:`ReplicaNode.create`) are below this (18 digits: a query's integer)."""


class ReplicaFenced(LedgerFenced):
    """The replica was fenced by a recovery: its ledger has (or is getting) a new owner."""


class ReplicaGap(LedgerError):
    """A batch does not start at the replica's count (``count``): it missed one."""

    def __init__(self, message: str, *, count: int) -> None:
        super().__init__(message)
        self.count = count


class WrongInstance(LedgerError):
    """The request names another instance of this node (it was wiped, or is another)."""


class _KeyLock:
    """One replica's lock, and how many operations hold or wait for it."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0


class ReplicaNode:
    """The replicas kept under ``root``. ``tail_bytes``: the most one batch spans on disk
    (what a crash of this node may have torn off a replica's end)."""

    def __init__(self, root: Path, *, tail_bytes: int, threads: int = 4) -> None:
        self.root = root
        self._files = FileLogStorage(root)
        self._tail_bytes = tail_bytes
        self.max_request_bytes = tail_bytes
        """The largest batch a writer sends (its frames take no more than its records)."""
        self.instance = _instance(root)
        self._held: OrderedDict[tuple[str, int], FileEntryLog] = OrderedDict()
        """Replicas held open, least recently used first (at most about MAX_OPEN)."""
        self._readers: dict[tuple[str, int], int] = {}
        """Reads in flight per replica (they run outside its lock): never closed under one."""
        self._locks: dict[tuple[str, int], _KeyLock] = {}
        """The locks of replicas held open or in use (dropped when neither)."""
        self._claims: dict[tuple[str, int], int] = {}
        """The claim of each replica made here by one create and used by no one since
        (:meth:`discard`): dropped at its first append or fence, at a second create, and
        when it is removed or closed (held replicas only: as few as those)."""
        self._guard = threading.Lock()
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="replica-node")

    async def run(self, call: Callable[..., T], *args: object) -> T:
        """Run one of the blocking methods below on the node's own threads."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, call, *args)

    def check(self, instance: str) -> None:
        """Raises WrongInstance unless the request is for this instance."""
        if instance != self.instance:
            raise WrongInstance(
                f"this storage node is instance {self.instance}, not {instance}: it was "
                "emptied or replaced since, and holds none of that instance's replicas"
            )

    # ------------------------------------------------------------------ operations

    def create(self, name: str, ledger_id: int) -> int:
        """A new, empty replica (idempotent while it is still empty). Returns this
        create's claim: what its writer gives :meth:`discard` if the create fails.

        Raises:
            ReplicaFenced: a recovery fenced it before it was created here.
            LedgerCorrupted: it already holds entries.
        """
        key = (name, ledger_id)
        claim = secrets.randbelow(CLAIM_LIMIT - 1) + 1
        with self._locked(key):
            if self._fence_path(key).exists():
                raise ReplicaFenced(f"replica {ledger_id} of {name} is fenced")
            held = self._held.get(key)
            if held is not None:
                if held.count:
                    raise LedgerCorrupted(f"replica {ledger_id} of {name} already has entries")
                os.utime(self._files.path(name, ledger_id))  # in use again: not garbage
                self._claims.pop(key, None)  # (two creates made it theirs: neither discards)
                return claim
            created = self._files.create(name, ledger_id)
            self._hold(key, created)
            if not created.reused:  # (one found made: by whom is not known here)
                self._claims[key] = claim
            return claim

    def discard(self, name: str, ledger_id: int, claim: int) -> bool:
        """Remove the replica the create that answered ``claim`` made, as its create
        failed; returns whether it was removed. Only while no one else can use it: it
        is still empty, not fenced, unread, and no other create claimed it (a create of
        an empty replica is idempotent: another owner, creating the same ledger id, may
        have made it its own), and this node held it open since that create (a node that
        restarted or closed it meanwhile does not know who else created it). Left, it is
        the sweep's (:mod:`segtxn.ledger.replicas.sweep`)."""
        key = (name, ledger_id)
        with self._locked(key):
            held = self._held.get(key)
            if self._claims.get(key) != claim or held is None or held.count:
                return False
            with self._guard:
                if self._readers.get(key):
                    return False
            self._remove(key)
            return True

    def append(
        self, name: str, ledger_id: int, first: int, payloads: Sequence[bytes], recovery: bool
    ) -> int:
        """Append a batch that starts at entry ``first``; returns the count held, once
        it is durable. A recovery's batch passes a fence and may overlap what is held (the
        overlap is skipped: a replica only holds a prefix of its ledger's one sequence).

        Raises:
            ReplicaFenced: a normal append to a fenced replica.
            ReplicaGap: ``first`` is not the count held (after the overlap, for recovery).
        """
        key = (name, ledger_id)
        with self._locked(key):
            self._claims.pop(key, None)  # (in use: never discarded)
            if not recovery and self._fence_path(key).exists():
                raise ReplicaFenced(f"replica {ledger_id} of {name} is fenced")
            replica = self._replica(key, create=recovery)
            count = replica.count
            if recovery and first < count:
                payloads = payloads[count - first :]
                first = count
            if first != count:
                raise ReplicaGap(
                    f"replica {ledger_id} of {name} holds {count} entries; a batch from "
                    f"{first} would leave a gap",
                    count=count,
                )
            if payloads:
                replica.append_batch(payloads)
            return replica.count

    def fence(self, name: str, ledger_id: int) -> tuple[int, int]:
        """Refuse normal appends from now on (durable before this returns); returns the
        (count, size in bytes) held at that moment.

        Raises:
            LedgerMissing: the replica has no file here. It is fenced all the same (a late
                create is refused; a recovery's copy may still fill it), but it vouches for
                nothing: a ledger's placement only names replicas that were created, so a
                missing one lost what it acknowledged, and counting it as empty would let
                a recovery end the ledger before acknowledged entries (BookKeeper #2908).
        """
        key = (name, ledger_id)
        with self._locked(key):
            self._claims.pop(key, None)  # (a recovery uses it: never discarded)
            path = self._fence_path(key)
            if not path.exists():
                fd = create_file(path, os.O_WRONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                _fsync_dir(path.parent)
            if key not in self._held and not self._files.exists(name, ledger_id):
                raise LedgerMissing(
                    f"replica {ledger_id} of {name} is not on this node (fenced anyway)",
                    paths=(str(self._files.path(name, ledger_id)),),
                )
            replica = self._replica(key, create=False)
            return replica.count, replica.size_bytes()

    def stat(self, name: str, ledger_id: int) -> tuple[int, int]:
        """The (count, size in bytes) the replica holds; nothing changes (a repair asks
        this of the copies it keeps).

        Raises:
            LedgerMissing: no such replica here.
        """
        key = (name, ledger_id)
        with self._locked(key):
            if key not in self._held and not self._files.exists(name, ledger_id):
                raise LedgerMissing(
                    f"replica {ledger_id} of {name} is not on this node",
                    paths=(str(self._files.path(name, ledger_id)),),
                )
            replica = self._replica(key, create=False)
            return replica.count, replica.size_bytes()

    def read(self, name: str, ledger_id: int, first: int, last: int) -> list[bytes]:
        """Entries ``first..last`` of the replica, or fewer from ``first`` (at least one):
        as many as fit in ``READ_BYTES``.

        Raises:
            LedgerMissing: no such replica here.
            IndexError: it does not hold ``first``.
            LedgerCorrupted: an entry fails its checksum.
        """
        key = (name, ledger_id)
        with self._locked(key):
            replica = self._replica(key, create=False)
            with self._guard:
                self._readers[key] = self._readers.get(key, 0) + 1
        try:
            if first >= replica.count:
                raise IndexError(f"replica {ledger_id} of {name} holds {replica.count} entries")
            fit = replica.entries_within(first, READ_BYTES)
            last = min(last, replica.count - 1, first + fit - 1)
            return replica.read(first, last)
        except OSError as e:  # deleted (a trim) while this read went on
            where = self._files.where(name, ledger_id)
            raise LedgerMissing(f"{where}: gone while it was read ({e})", paths=(where,)) from e
        finally:
            with self._guard:
                left = self._readers[key] - 1
                if left:
                    self._readers[key] = left
                else:
                    del self._readers[key]

    def delete(self, name: str, ledger_id: int) -> None:
        """Remove the replica and its fence (idempotent)."""
        key = (name, ledger_id)
        with self._locked(key):
            self._remove(key)

    def untouched(self, before_ns: int) -> list[tuple[str, int]]:
        """The replicas (and fences without a replica) here whose files were all last
        modified before ``before_ns`` (wall clock, ns), by ledger name: candidates for the
        sweep, to be checked against the store."""
        found: list[tuple[str, int]] = []
        for directory in sorted(self.root.iterdir()):
            if not directory.is_dir():
                continue
            name = unquote(directory.name)
            try:
                ids = {int(p.stem) for p in directory.iterdir() if _replica_file(p)}
            except FileNotFoundError:  # its last replica deleted meanwhile (and it with it)
                continue
            for ledger_id in sorted(ids):
                if self._last_touched((name, ledger_id)) < before_ns:
                    found.append((name, ledger_id))
        return found

    def remove_untouched(self, name: str, ledger_id: int, before_ns: int) -> bool:
        """Remove the replica (and its fence) if it is still untouched since before
        ``before_ns`` and no read is using it, checked under its lock; returns whether
        it was removed."""
        key = (name, ledger_id)
        with self._locked(key):
            with self._guard:
                if self._readers.get(key):
                    return False
            touched = self._last_touched(key)
            if not touched or touched >= before_ns:  # (gone already, or in use again)
                return False
            self._remove(key)
            return True

    def close(self) -> None:
        """Let the operations in flight end (an append's fsync), then close every replica."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        with self._guard:
            held, self._held = self._held, OrderedDict()
        for replica in held.values():
            replica.close()

    # ------------------------------------------------------------------ helpers

    @contextlib.contextmanager
    def _locked(self, key: tuple[str, int]) -> Iterator[None]:
        """Hold ``key``'s lock (made on first use, dropped after its last use once the
        replica is not held open: the locks stay as few as the replicas in use)."""
        with self._guard:
            entry = self._locks.get(key)
            if entry is None:
                entry = self._locks[key] = _KeyLock()
            entry.users += 1
        try:
            with entry.lock:
                yield
        finally:
            self._unuse(key, entry)

    def _unuse(self, key: tuple[str, int], entry: _KeyLock) -> None:
        with self._guard:
            entry.users -= 1
            if not entry.users and key not in self._held and self._locks.get(key) is entry:
                del self._locks[key]

    def _remove(self, key: tuple[str, int]) -> None:
        """Close and delete the replica, then its fence (a crash in between leaves a fence
        alone, never an unfenced replica), then their directory if nothing else is in it
        (``key``'s lock held): an empty directory per deleted ledger would pile up."""
        held = self._held.pop(key, None)
        self._claims.pop(key, None)
        if held is not None:
            held.close()
        self._files.delete(*key)
        fence = self._fence_path(key)
        fence.unlink(missing_ok=True)
        remove_if_empty(fence.parent)

    def _last_touched(self, key: tuple[str, int]) -> int:
        """The latest modification time (ns) of the replica's file and fence (0: none)."""
        latest = 0
        for path in (self._files.path(*key), self._fence_path(key)):
            with contextlib.suppress(FileNotFoundError):
                latest = max(latest, path.stat().st_mtime_ns)
        return latest

    def _fence_path(self, key: tuple[str, int]) -> Path:
        return self._files.path(*key).with_suffix(".fenced")

    def _replica(self, key: tuple[str, int], *, create: bool) -> FileEntryLog:
        """The replica held open, opened (recovered: a torn tail is what this node never
        acknowledged) on first use, or created for a recovery's copy."""
        held = self._held.get(key)
        if held is not None:
            self._held.move_to_end(key)
            return held
        replica: EntryLog
        if create and not self._files.exists(*key):
            replica = self._files.create(*key)
        else:
            recovered = self._files.recover(*key, log_format=FORMAT, tail_bytes=self._tail_bytes)
            replica = recovered.log
        assert isinstance(replica, FileEntryLog)  # (what file storage hands out)
        self._hold(key, replica)
        return replica

    def _hold(self, key: tuple[str, int], replica: FileEntryLog) -> None:
        """Keep ``replica`` open (``key``'s lock held), closing idle ones past the limit."""
        self._held[key] = replica
        if len(self._held) > MAX_OPEN:
            self._close_idle(but=key)

    def _close_idle(self, *, but: tuple[str, int]) -> None:
        """Close the least recently used replicas until at most :data:`MAX_OPEN` are open:
        those whose lock is free (nothing is appended or fenced there now) and that no
        read is using. They are opened again on their next use. Called with ``but``'s lock
        held; other locks are only tried, never waited for (no lock order to get wrong)."""
        for key in list(self._held):
            if len(self._held) <= MAX_OPEN:
                return
            if key == but:
                continue
            with self._guard:
                entry = self._locks.get(key)
                if entry is None:
                    continue
                entry.users += 1
            try:
                if not entry.lock.acquire(blocking=False):
                    continue
                try:
                    with self._guard:
                        if self._readers.get(key):
                            continue
                        replica = self._held.pop(key, None)
                    self._claims.pop(key, None)
                    if replica is not None:
                        replica.close()
                finally:
                    entry.lock.release()
            finally:
                self._unuse(key, entry)


def _instance(root: Path) -> str:
    """This node's instance id: read from the root, or made for a new (empty) root.

    Raises:
        LedgerCorrupted: the root holds replicas but no instance id (it cannot say whose).
    """
    root.mkdir(parents=True, exist_ok=True)
    path = root / INSTANCE_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    temporary = root / f"{INSTANCE_FILE}.new"  # (a crash while making one leaves it)
    if any(p != temporary for p in root.iterdir()):
        raise LedgerCorrupted(
            f"{root} holds replicas but no {INSTANCE_FILE} file: it cannot be told which "
            "storage node wrote them; refusing to start on it",
            path=str(root),
        )
    instance = secrets.token_hex(8)
    temporary.write_text(instance + "\n")
    fd = os.open(temporary, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    temporary.rename(path)
    _fsync_dir(root)
    return instance


def _replica_file(path: Path) -> bool:
    """A replica's file or fence: ``<16 digits>.log`` / ``.fenced`` (not a temporary)."""
    return path.suffix in (".log", ".fenced") and path.stem.isdigit() and len(path.stem) == 16


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
