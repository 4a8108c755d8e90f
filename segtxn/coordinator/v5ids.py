"""The v5 coordinator ids one process holds, and the transaction ids it mints under them.

A v5 transaction id is ``(most, least)``: ``most`` is a coordinator id this process holds
(a lease, via leader election, on one store session for all of them); ``least`` comes from a
block reserved with a CAS at ``/txn-coordinators/ids/<most>``, so ids are never reused, even
across take-overs. Every write made under an id is guarded by its election's fencing token
(:attr:`Held.leadership`), so a deposed holder cannot mint ids any more.

The process is listed among the coordinators (``T.COORDINATOR_MEMBERS``) on the same
session. When that session expires (the store was unreachable for its TTL), the ids and the
listing went with it, and :class:`HeldIds` registers again on a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from urllib.parse import quote

import msgspec

from segtxn.coordinator.retry import Retry
from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.metastore import (
    MUST_NOT_EXIST,
    Check,
    LeaderElection,
    Leadership,
    MetadataStore,
    MetadataStoreError,
    Put,
    Session,
)
from segtxn.metastore.election import ELECTIONS_PREFIX
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.txn import V5_COORDINATOR_BASE
from segtxn.stopping import Stopping
from segtxn.topics import transactions as T

log = logging.getLogger(__name__)

ID_BLOCKS = "/txn-coordinators/ids/"
ELECTION_PREFIX = T.COORDINATOR_ELECTIONS.removeprefix(ELECTIONS_PREFIX)


def election_name(coordinator_id: int) -> str:
    return f"{ELECTION_PREFIX}{coordinator_id:x}"


class IdBlock(msgspec.Struct):
    next: int


@dataclass
class Held:
    """One coordinator id held: its leadership, and the block of ``least`` values reserved."""

    leadership: Leadership
    next_least: int = 0
    block_end: int = 0


class HeldIds:
    """Campaigns for the ids ``0 .. settings.coordinator_ids - 1`` (above
    ``V5_COORDINATOR_BASE``), holds those it wins, and campaigns again for those it loses."""

    def __init__(self, store: MetadataStore, settings: CoordinatorSettings) -> None:
        self.store = store
        self.settings = settings
        self.held: dict[int, Held] = {}
        self.ready = asyncio.Event()
        """Set once an id is held (the first NEW_TXN can be served)."""
        self._session: Session | None = None
        self._holds: list[asyncio.Task[None]] = []
        """One campaign task per id, on the current session."""
        self._keeper: asyncio.Task[None] | None = None
        self._round_robin = 0
        self._id_lock = asyncio.Lock()

    @property
    def session(self) -> Session | None:
        """The store session the ids are held on (None before :meth:`start`)."""
        return self._session

    async def start(self) -> None:
        """Register on a new session and start campaigning (returns before any id is held).

        Raises:
            MetadataStoreError: the store could not open the session or list this process.
        """
        await self._register()
        self._keeper = asyncio.create_task(self._keep_registered(), name="coordinator-registration")

    async def _register(self) -> None:
        """Open a session, list this process among the coordinators on it, and campaign
        for every id with it. A session whose listing failed is closed: kept, it stayed
        alive for nothing (a lease and a keep-alive task per failed try, while the store
        refused the write)."""
        session = await self.store.open_session(self.settings.session_ttl_s)
        url = self.settings.advertise_url
        try:
            await self.store.put(
                T.COORDINATOR_MEMBERS + quote(url, safe=""), url.encode(), session=session
            )
        except BaseException:
            with contextlib.suppress(MetadataStoreError):  # (else it expires by itself)
                await session.close()
            raise
        self._session = session
        self._holds = [
            asyncio.create_task(
                self._hold(V5_COORDINATOR_BASE + n, session),
                name=f"coordinator-id-{V5_COORDINATOR_BASE + n:x}",
            )
            for n in range(self.settings.coordinator_ids)
        ]

    async def _keep_registered(self) -> None:
        """When the session expires (the store was unreachable for its TTL), every id and
        the member record went with it: register again with a new session, retrying while
        it fails (:mod:`segtxn.coordinator.retry`). (Without this a coordinator never
        served again after an outage longer than its TTL; retrying only the store's errors,
        any other one ended this loop, and with it every later registration.)"""
        while True:
            assert self._session is not None
            await self._session.expired.wait()
            log.warning(
                "coordinator %s: session %#x expired (its ids and member record are gone); "
                "registering again",
                self.settings.advertise_url,
                self._session.lease_id,
            )
            for task in self._holds:
                task.cancel()
            await asyncio.gather(*self._holds, return_exceptions=True)
            self.held.clear()
            retry = Retry(f"coordinator {self.settings.advertise_url}: registration", 1.0)
            while True:
                try:
                    await self._register()
                    retry.reset()
                    break
                except Exception as e:
                    await retry.after(e)

    async def _hold(self, coordinator_id: int, session: Session) -> None:
        """Campaign for one coordinator id with ``session``; hold it; campaign again if it
        is lost, or if a campaign failed (:mod:`segtxn.coordinator.retry`; it retried only
        the store's errors, and any other one ended this loop: the id was never held again
        by this process), while the session lives (when it expires,
        :meth:`_keep_registered` starts over with a new one)."""
        election = LeaderElection(
            self.store,
            election_name(coordinator_id),
            session,
            self.settings.advertise_url.encode(),
        )
        retry = Retry(f"coordinator id {coordinator_id:x}: campaign", 1.0)
        while not session.is_expired:
            try:
                leadership = await election.campaign()
            except Exception as e:
                if session.is_expired:
                    return
                await retry.after(e)
                continue
            retry.reset()
            self.held[coordinator_id] = Held(leadership)
            self.ready.set()
            log.info(
                "coordinator id %x: held by this coordinator (%s)",
                coordinator_id,
                self.settings.advertise_url,
            )
            await leadership.lost.wait()
            self.held.pop(coordinator_id, None)
            log.warning("coordinator id %x: lease lost; campaigning again", coordinator_id)

    async def stop(self, stopping: Stopping | None = None) -> None:
        """Stop campaigning, resign every id held (another process can take it at once) and
        close the session: each step whatever the one before raised, a failure logged at
        WARNING, all within ``stopping``'s time (:mod:`segtxn.stopping`;
        default: a stop of its own). Never raises but a cancellation."""
        stopping = stopping or Stopping("coordinator ids")
        tasks = [t for t in (self._keeper, *self._holds) if t is not None]
        await stopping.cancel("its campaigns", tasks)
        held = dict(self.held)
        self.held.clear()
        await stopping.steps(
            *((f"resigning id {i:x}", h.leadership.resign()) for i, h in held.items())
        )
        if self._session is not None:
            await stopping.step("closing its store session", self._session.close())

    def pick(self) -> tuple[int, Held]:
        """The next id held, round robin.

        Raises:
            ServerError(ServiceNotReady): none is held.
        """
        ids = sorted(self.held)
        if not ids:
            raise ServerError(ErrorName.SERVICE_NOT_READY, "this coordinator holds no id yet")
        self._round_robin += 1
        coordinator_id = ids[self._round_robin % len(ids)]
        return coordinator_id, self.held[coordinator_id]

    async def next_least(self, coordinator_id: int, held: Held) -> int:
        """A ``least`` never given out under ``coordinator_id`` before: from the block held,
        reserving the next block (a fenced CAS) when it is used up.

        Raises:
            MetadataStoreError: the store failed, or ``held`` is no longer the leader
                (BadVersion / NotFound on its election key).
        """
        async with self._id_lock:
            if held.next_least >= held.block_end:
                key = f"{ID_BLOCKS}{coordinator_id:x}"
                record = await self.store.get(key)
                start = (
                    1 if record is None else msgspec.json.decode(record.value, type=IdBlock).next
                )
                end = start + self.settings.id_block
                await self.store.commit(
                    [
                        Check(held.leadership.election.key, held.leadership.token),
                        Put(
                            key,
                            msgspec.json.encode(IdBlock(end)),
                            expected_version=record.version if record else MUST_NOT_EXIST,
                        ),
                    ]
                )
                held.next_least, held.block_end = start, end
            least = held.next_least
            held.next_least += 1
            return least
