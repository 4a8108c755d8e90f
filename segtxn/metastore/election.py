"""Leader election on a session: one key, created only if absent, held by a lease.

The winner's record version is its *fencing token*: it only grows across leaders, so a
component that writes shared state on behalf of a leadership can guard those writes with
``Check(election_key, token)`` and a deposed leader's late writes fail instead of landing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from segtxn.aio import first_completed
from segtxn.metastore.errors import (
    AlreadyExists,
    BadVersion,
    Compacted,
    NotFound,
    SessionExpired,
)
from segtxn.metastore.records import MUST_NOT_EXIST, EventKind, Record
from segtxn.metastore.session import Session
from segtxn.metastore.store import MetadataStore

log = logging.getLogger(__name__)

ELECTIONS_PREFIX = "/segtxn/elections/"


class Leadership:
    """Held leadership. ``lost`` is set when the session expires or the key goes away."""

    def __init__(self, election: LeaderElection, record: Record) -> None:
        self.election = election
        self.token = record.version
        self.lost = asyncio.Event()
        self._task = asyncio.create_task(
            self._guard(), name=f"leadership-{election.name}-{self.token}"
        )

    async def _guard(self) -> None:
        try:
            await first_completed(
                self._key_changes(),
                self.election.session.expired.wait(),
                name=f"leadership-{self.election.name}",
            )
        finally:
            self.lost.set()

    async def _key_changes(self) -> None:
        """Return when the election key is deleted or rewritten by someone else."""
        store, key = self.election.store, self.election.key
        start = self.token + 1
        while True:
            try:
                async with store.watch(key, from_revision=start) as events:
                    async for event in events:
                        if event.kind is EventKind.DELETE or (
                            event.record is not None and event.record.version != self.token
                        ):
                            return
            except Compacted:
                # history is gone, not necessarily the key: look at it again
                current, start = await self.election.read()
                if current is None or current.version != self.token:
                    return

    async def resign(self) -> None:
        """Give leadership up (delete the key if it is still ours). Idempotent."""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        with contextlib.suppress(NotFound, BadVersion):
            await self.election.store.delete(self.election.key, expected_version=self.token)
        self.lost.set()


class LeaderElection:
    """Campaign for leadership of ``name`` among every holder of a session on the store."""

    def __init__(
        self, store: MetadataStore, name: str, session: Session, value: bytes = b""
    ) -> None:
        self.store = store
        self.name = name
        self.session = session
        self.value = value
        self.key = ELECTIONS_PREFIX + name

    async def leader(self) -> Record | None:
        """The current leader's record (its value identifies it), or None."""
        return await self.store.get(self.key)

    async def read(self) -> tuple[Record | None, int]:
        """The leader's record and the revision after the read (to watch from)."""
        listing = await self.store.list_range(self.key, self.key + "\x01")
        current = listing.records[0] if listing.records else None
        return current, listing.revision + 1

    async def campaign(self) -> Leadership:
        """Wait until this candidate is the leader.

        Raises:
            SessionExpired: the session expired while waiting.
        """
        while True:
            self.session.check()
            try:
                record = await self.store.put(
                    self.key, self.value, expected_version=MUST_NOT_EXIST, session=self.session
                )
                return Leadership(self, record)
            except AlreadyExists:
                await self._wait_deleted()

    async def _wait_deleted(self) -> None:
        winner = await first_completed(
            self._deleted(), self.session.expired.wait(), name="campaign"
        )
        if winner == 1:
            raise SessionExpired("the session expired while campaigning")

    async def _deleted(self) -> None:
        """Return once the key is absent (re-reading it whenever history is compacted)."""
        while True:
            current, start = await self.read()
            if current is None:
                return
            try:
                async with self.store.watch(self.key, from_revision=start) as events:
                    async for event in events:
                        if event.kind is EventKind.DELETE:
                            return
            except Compacted:
                continue
