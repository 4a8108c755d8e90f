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
    StoreAccessDenied,
    StoreUnavailable,
)
from segtxn.metastore.records import MUST_NOT_EXIST, EventKind, Record
from segtxn.metastore.session import Session
from segtxn.metastore.store import MetadataStore

log = logging.getLogger(__name__)

ELECTIONS_PREFIX = "/segtxn/elections/"

RETRY_MIN_S = 0.01
"""The first pause before asking an unavailable store again (it doubles each time)."""


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
        """Return when the election key is deleted or rewritten by someone else.

        No store error ends it: when the history to resume from is compacted, the key is
        read again (not necessarily gone: still ours, keep watching); when the store does
        not answer that read or the watch after it (or refuses them: access may come back),
        both are tried again after a pause that grows to the store's
        ``watch_retry_max_s``. A store lost for long ends the
        leadership through the session, whose ``expired`` is set after a whole TTL
        without it. Ending here on an error would set ``lost`` while the key is still
        ours, and a new campaign would wait for ever for that key to go.
        """
        store, key = self.election.store, self.election.key
        start = self.token + 1
        compacted = False
        pause_s = RETRY_MIN_S
        while True:
            try:
                if compacted:
                    current, start = await self.election.read()
                    if current is None or current.version != self.token:
                        return
                    compacted = False
                async with store.watch(key, from_revision=start) as events:
                    pause_s = RETRY_MIN_S
                    async for event in events:
                        if event.kind is EventKind.DELETE or (
                            event.record is not None and event.record.version != self.token
                        ):
                            return
            except Compacted:
                compacted = True  # history is gone, not necessarily the key: read it
            except (StoreUnavailable, StoreAccessDenied) as e:  # (access may come back)
                log.warning("leadership %s: the store did not answer (%s); again", key, e)
                await asyncio.sleep(pause_s)
                pause_s = min(pause_s * 2, store.settings.watch_retry_max_s)

    async def resign(self) -> None:
        """Give leadership up (delete the key if it is still ours) and set ``lost``.
        Idempotent.

        Raises:
            MetadataStoreError: the delete failed (the store away, say). The leadership is
                then still held and still guarded, ``lost`` unset: the key may well still
                be ours, and ``lost`` is set when the leadership ends (the session expiring
                or closed, the key going) or when a resign tried again succeeds. (The guard
                was stopped before the delete: after a failed one, ``lost`` was never set,
                whatever became of the key, and a holder waiting on it waited for ever.)
        """
        with contextlib.suppress(NotFound, BadVersion):
            await self.election.store.delete(self.election.key, expected_version=self.token)
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
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
        """Wait until this candidate is the leader. Safe to call again on the same session
        after it failed: a create that landed but whose answer was lost left the key held
        by this session, and the retry takes it (waiting for it to go would be waiting for
        ever, the session keeping it alive).

        Raises:
            SessionExpired: the session expired while waiting.
            MetadataStoreError: the store failed (the key may have been taken or not).
        """
        while True:
            self.session.check()
            try:
                record = await self.store.put(
                    self.key, self.value, expected_version=MUST_NOT_EXIST, session=self.session
                )
                return Leadership(self, record)
            except AlreadyExists:
                current, _ = await self.read()
                if current is not None and current.session_id == self.session.lease_id:
                    return Leadership(self, current)  # an earlier attempt of ours landed
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
