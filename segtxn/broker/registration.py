"""A broker's claim on its id: the ephemeral record ``/brokers/<id>`` on its session.

Two processes must never both believe they are broker ``x``: clients are sent to whatever
URL the record holds, and the topics homed on ``x`` live on one disk. So the record is
*created* on the broker's session, never written over another session's (a create-only
write, then compare-and-sets on its own version), and:

- **At start-up** a record of another session is either a live broker with this id, or this
  broker's previous process, killed before it could revoke its session; the store deletes
  that one when its session's TTL runs out. The broker waits for it (saying so once), for
  at most the holder's TTL plus a margin (:func:`grace_s`); a record still there after that
  is being renewed by a live process, and the start-up is refused (:class:`BrokerIdTaken`).
- **While serving**, the broker watches its record (:meth:`Registration.lost`). If it is
  deleted or written by anyone else, the broker logs a WARNING, is not ready (``trouble``
  says why), and claims the id again once the key is free; while another live session
  holds it, it says so at ERROR every :func:`grace_s` and stays not ready.
- When its own session expired (the store was unreachable for a TTL), its old record may
  still be in the store for a moment: it deletes that one (by version) instead of waiting.
- Whether it holds the id *now* (:meth:`Registration.unproven`): its record is held and
  its session is provably alive. What the broker does while it cannot prove it:
  :mod:`segtxn.broker.fencing`.

Without this (trial 2, S1) a second broker started with a live broker's id overwrote the
record, and deleted it when it stopped: the first broker said nothing and stayed ready, and
its topics were unreachable until it was restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable

import msgspec

from segtxn.metastore import (
    AlreadyExists,
    BadVersion,
    Compacted,
    NotFound,
    Record,
    Session,
    StoreAccessDenied,
    StoreUnavailable,
)
from segtxn.topics.catalog import BrokerInfo, Catalog, broker_key

log = logging.getLogger(__name__)

RETRY_MIN_S = 0.01
"""The first pause before asking an unavailable store again (it doubles each time)."""

PAST_SESSIONS = 4
"""This process's expired sessions remembered, whose records it may delete itself."""


class BrokerIdTaken(Exception):
    """The broker id is registered by another live session (the message says whose)."""


def grace_s(ttl_s: float) -> float:
    """How long a record of a session with ``ttl_s`` may outlive its crashed holder: the TTL
    from when it was first seen (its last refresh was before that), plus a margin for the
    store's expiry sweep (etcd checks leases every 500 ms) and its commit."""
    return ttl_s + max(1.0, ttl_s / 4)


def _decode(record: Record | None) -> BrokerInfo | None:
    """The record's broker info; None for none, or for a value that is not one (a record
    written by hand)."""
    if record is None:
        return None
    try:
        return msgspec.json.decode(record.value, type=BrokerInfo)
    except msgspec.DecodeError:
        return None


def _holder(record: Record, info: BrokerInfo | None) -> str:
    url = info.url if info is not None else "an unknown URL"
    session = f"session {record.session_id:#x}" if record.session_id else "no session"
    return f"{url} ({session})"


class Registration:
    """This broker's record: claim it, keep it up to date, notice losing it."""

    def __init__(self, catalog: Catalog, broker_id: str, url: str, *, instance: str) -> None:
        self.catalog = catalog
        self.broker_id = broker_id
        self.url = url
        self.instance = instance
        self.key = broker_key(broker_id)
        self.draining = False
        self.trouble: str | None = "not registered in the metadata store yet"
        """Why the broker is not registered now (None: it is)."""
        self._session: Session | None = None
        self._version = 0
        """The version of the record this broker wrote last (0: it holds none)."""
        self._past: deque[int] = deque(maxlen=PAST_SESSIONS)

    async def claim(
        self,
        session: Session,
        *,
        refuse: bool,
        taken: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        """Create the record on ``session`` (with the current ``draining``).

        A record of another session is waited for until it goes. ``refuse`` (start-up):
        give up once it has outlived :func:`grace_s` of its holder's TTL, which only a live
        holder's renewals explain. Else (serving) say so at ERROR each time and go on;
        ``taken`` is called (with who holds it) the first time.

        Raises:
            BrokerIdTaken: ``refuse``, and a live session holds the id.
            SessionExpired: ``session`` expired.
            MetadataStoreError: the store failed (the record may have been written or not:
                claiming again on the same session finds it).
        """
        self.release()
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        while True:
            session.check()
            try:
                record = await self.catalog.register_broker(
                    self.broker_id, self.url, session, instance=self.instance,
                    draining=self.draining,
                )  # fmt: skip
            except AlreadyExists:
                pass
            else:
                self._hold(session, record)
                return
            current, info, revision = await self.catalog.broker_record(self.broker_id)
            if current is None:
                continue
            if current.session_id == session.lease_id:  # an earlier attempt landed
                self._hold(session, current)
                await self.update()  # its draining may be out of date
                return
            if current.session_id in self._past:  # its own, from before a store outage
                with contextlib.suppress(NotFound, BadVersion):
                    await self.catalog.store.delete(self.key, expected_version=current.version)
                continue
            holder = _holder(current, info)
            wait = grace_s(max(session.ttl_s, info.session_ttl_s if info else 0.0))
            if deadline is None:
                deadline = loop.time() + wait
                self.trouble = f"broker id {self.broker_id} is registered by {holder}"
                if refuse:
                    log.warning(
                        "broker id %s is registered by %s: this broker before a crash whose "
                        "session has not expired yet, or a live broker with the same id; "
                        "waiting up to %.1f s for that registration to go",
                        self.broker_id, holder, wait,
                    )  # fmt: skip
                else:
                    log.error(
                        "broker id %s is registered by another broker, %s: this broker is "
                        "not ready until that registration goes (stop one of them)",
                        self.broker_id, holder,
                    )  # fmt: skip
                    if taken is not None:
                        await taken(holder)
            elif loop.time() >= deadline:
                if refuse:
                    raise BrokerIdTaken(
                        f"broker id {self.broker_id} is already registered by a live broker "
                        f"at {holder}; stop it first, or start this one with another "
                        "--broker-id (a standalone: a --store namespace of its own, "
                        "etcd://host:port/NS)"
                    )  # a standalone's id is always "standalone": it has no --broker-id
                log.error(
                    "broker id %s is still registered by another live broker, %s: this "
                    "broker is not ready until that registration goes (stop one of them)",
                    self.broker_id, holder,
                )  # fmt: skip
                deadline = loop.time() + wait
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(deadline):
                    await self._changed(revision + 1)

    async def _changed(self, start: int) -> None:
        """Return at the next change of the record after ``start`` - 1 (or when history
        from there is gone: the caller reads it again)."""
        with contextlib.suppress(Compacted):
            async with self.catalog.store.watch(self.key, from_revision=start) as events:
                async for _ in events:
                    return

    def _hold(self, session: Session, record: Record) -> None:
        self._session = session
        self._version = record.version
        self.trouble = None
        log.info(
            "broker %s registered at %s (session %#x, ttl %g s)",
            self.broker_id, self.url, session.lease_id, session.ttl_s,
        )  # fmt: skip

    def unproven(self) -> str | None:
        """Why this process cannot prove now that it holds the id (None: it can): it holds
        the record, nobody has written over it, and its session is provably alive
        (:meth:`Session.alive`)."""
        if self.trouble is not None:
            return self.trouble
        session = self._session
        if session is None or not self._version:
            return "not registered"
        if not session.alive():
            return f"session {session.lease_id:#x} went a TTL without a refresh"
        return None

    def release(self) -> None:
        """Forget the record held (lost, or its session expired); remember the session so
        that a record of it still in the store is deleted rather than waited for."""
        session = self._session
        if session is not None and session.is_expired and session.lease_id not in self._past:
            self._past.append(session.lease_id)
        self._version = 0

    async def update(self) -> None:
        """Rewrite the record held (the current ``draining``), by version.

        Raises:
            BadVersion, NotFound: the record changed or went (:meth:`lost` reports it).
            MetadataStoreError: the store failed.
        """
        if self._session is None or not self._version:
            raise NotFound(f"broker {self.broker_id} is not registered")
        record = await self.catalog.register_broker(
            self.broker_id, self.url, self._session, instance=self.instance,
            draining=self.draining, expected_version=self._version,
        )  # fmt: skip
        self._version = record.version

    async def lost(self) -> None:
        """Return when the record held is deleted or written by another session, with
        ``trouble`` saying so.

        No store error ends it (as :class:`~segtxn.metastore.Leadership`'s watch): the watch
        resumes after connection loss; when the history to resume from is compacted, the
        record is read again; when the store does not answer, it is asked again after a
        pause growing to its ``watch_retry_max_s``. A store lost for long ends the
        registration through the session.
        """
        assert self._session is not None
        lease = self._session.lease_id
        store = self.catalog.store
        start = self._version + 1
        pause_s = RETRY_MIN_S
        while True:
            try:
                if not start:
                    current, info, revision = await self.catalog.broker_record(self.broker_id)
                    if current is None or current.session_id != lease:
                        self.trouble = self._why(current, info)
                        return
                    start = revision + 1
                async with store.watch(self.key, from_revision=start) as events:
                    pause_s = RETRY_MIN_S
                    async for event in events:
                        start = event.revision + 1
                        if event.record is None or event.record.session_id != lease:
                            self.trouble = self._why(event.record, _decode(event.record))
                            return
            except Compacted:
                start = 0  # history is gone, not necessarily the record: read it
            except (StoreUnavailable, StoreAccessDenied) as e:  # (access may come back)
                log.warning("registration %s: the store did not answer (%s); again", self.key, e)
                await asyncio.sleep(pause_s)
                pause_s = min(pause_s * 2, store.settings.watch_retry_max_s)

    def _why(self, record: Record | None, info: BrokerInfo | None) -> str:
        if record is None:
            return f"its registration {self.key} was deleted"
        return f"its registration {self.key} was overwritten, by {_holder(record, info)}"
