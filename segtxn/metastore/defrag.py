"""Defragmenting etcd: giving the space compaction frees back to the disk, one member at a time.

Compaction (docs/metastore.md, "Compaction") frees pages *inside* etcd's database file for
new revisions, but never shrinks the file: under a steady load whose history is compacted
the file still grew by 27 MiB an hour in the endurance run (issue 22), and a file that
reaches ``--quota-backend-bytes`` raises etcd's ``NOSPACE`` alarm whatever is in use. Only
defragmenting a member rewrites its file without the free pages.

A member that defragments answers nothing else until it is done (reads, writes, watches and
keep-alives wait; on a single-member etcd that is the whole store), so a round is bounded
and careful:

- it reads every member's status first (``dbSize``, ``dbSizeInUse``, leader) on the member's
  own client URL, and does nothing at all unless *every* member answered: with one member
  already down, blocking another could cost a three-member cluster its quorum;
- it defragments only members whose file holds at least ``min_free_bytes`` of free pages
  (``dbSize - dbSizeInUse``), followers before the leader, strictly one after another, each
  within ``timeout_s``, and reads each one's status again before going to the next (so the
  next starts only once the last one answers again);
- each member defragmented is one log line (INFO) with its file's size before and after and
  how long it was blocked, and is returned to the caller (a command prints it; the owner of
  a private etcd logs it).

:func:`run_defragmentation` runs a round every ``check_s`` seconds until cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from segtxn.metastore.errors import MetadataStoreError, StoreUnavailable
from segtxn.metastore.etcd import EtcdEngine
from segtxn.metastore.settings import StoreCredentials

log = logging.getLogger(__name__)

MIB = 1 << 20


@dataclass(frozen=True)
class DefragSettings:
    """When and how etcd's members are defragmented."""

    min_free_bytes: int = 256 * MIB
    """Defragment a member once this much of its database file is free pages (``dbSize -
    dbSizeInUse``). Defragmenting pauses the member while it rewrites its file (1.4 s for
    a 75 MiB file in the endurance run); a threshold well above what one check interval
    frees keeps pauses rare."""
    check_s: float = 600.0
    """How often :func:`run_defragmentation` looks (0: never)."""
    timeout_s: float = 120.0
    """How long one member's defragmentation may take before the round gives up on it."""
    request_timeout_s: float = 5.0
    """Each status and member-list call."""
    credentials: StoreCredentials = field(default_factory=StoreCredentials)
    """TLS and the user, as for the store (with etcd authentication on, the user needs the
    ``root`` role: defragmentation is an administrator's call)."""


PRIVATE_ETCD = DefragSettings(min_free_bytes=32 * MIB, check_s=300.0)
"""For a private single-member etcd (``--store etcd-local``, ``bench/``): its database is
small, so a pause of its only member (the whole store) to give back 32 MiB is short."""


@dataclass(frozen=True)
class MemberStatus:
    name: str
    endpoint: str
    """The ``host:port`` the member serves clients on."""
    member_id: int
    db_size: int
    db_size_in_use: int
    leader: bool

    @property
    def free_bytes(self) -> int:
        """Free pages in its database file: what defragmenting would give back."""
        return max(0, self.db_size - self.db_size_in_use)


@dataclass(frozen=True)
class Defragmented:
    before: MemberStatus
    after: MemberStatus
    seconds: float
    """How long the member was blocked."""

    def __str__(self) -> str:
        return (
            f"etcd member {self.before.name} ({self.before.endpoint}) defragmented in "
            f"{self.seconds:.2f} s: database file {self.before.db_size / MIB:.2f} MiB -> "
            f"{self.after.db_size / MIB:.2f} MiB ({self.after.db_size_in_use / MIB:.2f} MiB "
            "in use)"
        )


@dataclass(frozen=True)
class Round:
    """What one round saw and did."""

    members: list[MemberStatus]
    defragmented: list[Defragmented]
    skipped: str = ""
    """Why nothing was done although a member was due (empty: not skipped)."""


def due(members: Sequence[MemberStatus], min_free_bytes: int) -> list[MemberStatus]:
    """The members to defragment, in order: those with at least ``min_free_bytes`` free,
    followers first (by name), the leader last (its pause also delays every write)."""
    chosen = [m for m in members if m.free_bytes >= min_free_bytes]
    return sorted(chosen, key=lambda m: (m.leader, m.name))


async def defragment_round(endpoints: Sequence[str], settings: DefragSettings) -> Round:
    """One round (see the module docstring) over the cluster that ``endpoints`` (``host:port``,
    any of its members) reach.

    Raises:
        MetadataStoreError: no endpoint answered the member list. A member that does not
            answer its status skips the round (``Round.skipped``); one that fails while it
            defragments ends the round with the error (the members after it are left).
    """
    names = await _members(endpoints, settings)
    statuses: list[MemberStatus] = []
    for name, member_id, endpoint in names:
        try:
            statuses.append(await _status(name, member_id, endpoint, settings))
        except MetadataStoreError as e:
            reason = f"member {name} ({endpoint}) did not answer ({e}): nothing defragmented"
            log.warning("etcd defragmentation skipped: %s", reason)
            return Round(statuses, [], skipped=reason)
    done: list[Defragmented] = []
    for member in due(statuses, settings.min_free_bytes):
        done.append(await _defragment(member, settings))
        log.info("%s", done[-1])
    return Round(statuses, done)


async def run_defragmentation(endpoints: Sequence[str], settings: DefragSettings) -> None:
    """Run :func:`defragment_round` every ``settings.check_s`` seconds until cancelled; a
    round that fails is logged and the next one tries again."""
    if not settings.check_s:
        return
    while True:
        await asyncio.sleep(settings.check_s)  # a schedule, not a wait for a condition
        try:
            await defragment_round(endpoints, settings)
        except MetadataStoreError as e:
            log.warning("etcd defragmentation round failed: %s; trying at the next one", e)


def _engine(endpoint: str, settings: DefragSettings) -> EtcdEngine:
    return EtcdEngine(
        [endpoint],
        request_timeout_s=settings.request_timeout_s,
        credentials=settings.credentials,
    )


async def _members(
    endpoints: Sequence[str], settings: DefragSettings
) -> list[tuple[str, int, str]]:
    """(name, id, client ``host:port``) of every member, from the first endpoint that
    answers. Raises MetadataStoreError: none did."""
    problems: list[str] = []
    for endpoint in endpoints:
        engine = _engine(endpoint, settings)
        try:
            response = await engine.member_list()
        except MetadataStoreError as e:
            problems.append(f"{endpoint}: {e}")
            continue
        finally:
            await engine.close()
        return [(m.name or f"{m.ID:x}", int(m.ID), _client_endpoint(m)) for m in response.members]
    raise StoreUnavailable(f"no etcd endpoint listed its members ({'; '.join(problems)})")


def _client_endpoint(member: Any) -> str:
    """The ``host:port`` of a member's first client URL (``http://host:2379``)."""
    if not member.clientURLs:
        raise StoreUnavailable(f"etcd member {member.name or member.ID} has no client URL yet")
    parts = urlsplit(member.clientURLs[0])
    return str(parts.netloc or parts.path)


async def _status(
    name: str, member_id: int, endpoint: str, settings: DefragSettings
) -> MemberStatus:
    engine = _engine(endpoint, settings)
    try:
        response = await engine.member_status()
    finally:
        await engine.close()
    return MemberStatus(
        name,
        endpoint,
        member_id,
        int(response.dbSize),
        int(response.dbSizeInUse),
        leader=int(response.leader) == member_id,
    )


async def _defragment(member: MemberStatus, settings: DefragSettings) -> Defragmented:
    engine = _engine(member.endpoint, settings)
    started = time.monotonic()
    try:
        await engine.defragment(settings.timeout_s)
    finally:
        await engine.close()
    seconds = time.monotonic() - started
    after = await _status(member.name, member.member_id, member.endpoint, settings)
    return Defragmented(member, after, seconds)
