"""Sessions: a lease plus the keep-alive task that holds it.

A session is how a process says "I am alive" to the store. Records written with a session
are *ephemeral*: the store deletes them, all in one revision, when the session expires or
is closed. Ownership (of a topic, a coordinator id) and leader election are built on them.

The keep-alive task belongs to the session (and is cancelled by :meth:`Session.close`). It
refreshes the lease every third of its TTL. If the store stops answering, the session
declares itself expired once a full TTL has passed since the last successful refresh: past
that point the store may already have deleted its keys, so the holder must stop acting as
an owner. ``expired`` is set in every case where the lease is gone or may be gone.
"""

from __future__ import annotations

import asyncio
import logging

from segtxn.metastore.engine import Engine
from segtxn.metastore.errors import SessionExpired, StoreUnavailable

log = logging.getLogger(__name__)


class Session:
    """A live lease. Create one with :meth:`MetadataStore.open_session`."""

    def __init__(self, engine: Engine, lease_id: int, ttl_s: float, granted_at: float) -> None:
        """``granted_at``: the loop time just *before* the grant request was sent (the
        store's clock may have started the TTL at any moment after it)."""
        self._engine = engine
        self.lease_id = lease_id
        self.ttl_s = ttl_s
        self.expired = asyncio.Event()
        """Set once the lease is gone (expired, revoked, closed, or unreachable for a TTL)."""
        self._deadline = granted_at + ttl_s
        self._task = asyncio.create_task(
            self._keep_alive(), name=f"metastore-session-{lease_id:#x}-keepalive"
        )
        self._task.add_done_callback(self._on_done)

    @property
    def is_expired(self) -> bool:
        return self.expired.is_set()

    def alive(self) -> bool:
        """Whether the lease is provably alive now: not expired, and before the send time
        of its last successful refresh plus the TTL that refresh granted (the store's
        clock started that TTL later). ``expired`` is set at that time too, but by a task
        that may run after others do, when the process resumes from a pause: a holder that
        must not act once its lease may be gone asks this."""
        return not self.expired.is_set() and asyncio.get_running_loop().time() < self._deadline

    def check(self) -> None:
        """Raise ``SessionExpired`` if the session can no longer be used."""
        if self.expired.is_set():
            raise SessionExpired(f"session {self.lease_id:#x} has expired")

    async def _keep_alive(self) -> None:
        """Refresh every TTL/3; the lease is presumed gone at ``_deadline`` = send time of
        the last successful refresh + the TTL it granted, whatever a slow call is doing."""
        loop = asyncio.get_running_loop()
        interval = self.ttl_s / 3
        while True:
            await asyncio.sleep(max(0.0, min(interval, self._deadline - loop.time())))
            if loop.time() >= self._deadline:
                log.warning("session %#x: no refresh within its TTL", self.lease_id)
                break
            sent = loop.time()
            try:
                async with asyncio.timeout_at(self._deadline):
                    remaining = await self._engine.lease_keepalive(self.lease_id)
            except (StoreUnavailable, TimeoutError) as e:
                log.info("session %#x: keep-alive failed (%s); retrying", self.lease_id, e)
                interval = self.ttl_s / 10
                continue
            if remaining <= 0:
                log.warning("session %#x expired in the store", self.lease_id)
                break
            self._deadline = sent + remaining
            interval = self.ttl_s / 3
        self.expired.set()

    def _on_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("session %#x keep-alive failed", self.lease_id, exc_info=task.exception())
            self.expired.set()

    async def close(self) -> None:
        """Stop refreshing and revoke the lease, deleting the session's ephemeral records.

        Idempotent. If the store cannot be reached the lease simply expires by itself.
        """
        self._task.cancel()
        # gather() re-raises a cancellation of *this* task, and only that.
        await asyncio.gather(self._task, return_exceptions=True)
        if not self.expired.is_set():
            self.expired.set()
            try:
                await self._engine.lease_revoke(self.lease_id)
            except StoreUnavailable:
                log.warning("session %#x: could not revoke; it will expire", self.lease_id)

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
