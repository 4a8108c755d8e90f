"""A scalable topic's segment DAG, kept current by a lookup session.

The broker's ``/ws/v2/lookup/topic/...`` session sends the DAG and then every new version of
it. :class:`TopicLayout` holds the latest one (never going back to an older epoch), wakes
whoever waits for a change, and re-opens the session if it breaks. Producers route with it;
consumers follow it to find new segments. A version the broker cannot read comes as an error
frame (``{"error": "PersistenceError", "message"}``, docs/protocol.md): it is logged, and
the layout keeps the DAG it holds, on the same session, until a readable version comes.
A session that cannot be opened again for good (the broker's TLS certificate is not trusted)
stops, and says so (:attr:`TopicLayout.failed`, ``changed`` set).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

import aiohttp

from segtxn.client.connection import Connector
from segtxn.client.errors import CertificateError
from segtxn.client.timeouts import Deadline, retrying
from segtxn.protocol.errors import (
    NotAuthorized,
    ServerError,
    ServiceNotReady,
    TopicNotFound,
    Unauthenticated,
    UnknownError,
)
from segtxn.protocol.hashing import key_hash
from segtxn.protocol.names import TopicName

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Segment:
    id: int
    lo: int
    hi: int
    active: bool
    parents: tuple[int, ...]
    children: tuple[int, ...]
    retired: bool = False
    """Consumed by every subscription and deleted by retention: nothing to read."""

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> Segment:
        return cls(
            int(raw["id"]),
            int(raw["lo"]),
            int(raw["hi"]),
            raw["state"] == "ACTIVE",
            tuple(raw["parents"]),
            tuple(raw["children"]),
            raw["state"] == "RETIRED",
        )


class TopicLayout:
    def __init__(self, connector: Connector, topic: TopicName) -> None:
        self.topic = topic
        self._connector = connector
        self.epoch = -1
        self.segments: dict[int, Segment] = {}
        self._active: list[Segment] = []
        """The active segments by key range (routing asks on every send)."""
        self.changed = asyncio.Event()
        """Set (and replaced) whenever a newer DAG arrives, and when :attr:`failed` is set."""
        self.failed: CertificateError | None = None
        """Why the lookup session stopped for good: no newer DAG will come. A waiter for a
        change (a send for the layout after its segment was sealed, a consumer for the
        segments of a split) raises it rather than waiting for nothing."""
        self._task: asyncio.Task[None] | None = None
        self._said: str | None = None
        """The last error frame logged (the session repeats it for each unreadable version)."""

    async def start(self, deadline: Deadline) -> None:
        """Read the DAG (retrying while brokers or the store restart), then follow it.

        Raises:
            ServerError: e.g. TopicNotFound.
            Timeout: no broker answered the lookup before ``deadline``.
        """
        self.apply(
            await retrying(
                f"look {self.topic} up",
                lambda: self._connector.lookup(self.topic),
                deadline,
                request_timeout_s=self._connector.timeouts.request_timeout_s,
            )
        )
        self._task = asyncio.create_task(self._follow(), name=f"layout-{self.topic}")

    def apply(self, raw: dict[str, Any]) -> None:
        epoch = int(raw["epoch"])
        if epoch < self.epoch:
            return  # an older version than what we hold
        self.epoch = epoch
        self.segments = {s.id: s for s in (Segment.parse(x) for x in raw["segments"])}
        self._active = sorted((s for s in self.segments.values() if s.active), key=lambda s: s.lo)
        self._wake()

    def _wake(self) -> None:
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()

    async def refresh(self, timeout_s: float | None = None) -> None:
        """Look the DAG up now (when a send found a sealed segment before the push came).

        Raises ServerError, or Timeout after ``timeout_s`` (default: the operation timeout).
        """
        self.apply(await self._connector.lookup(self.topic, timeout_s=timeout_s))

    async def _follow(self) -> None:
        delay = 0.05
        while True:
            try:
                async with asyncio.timeout(self._connector.timeouts.request_timeout_s):
                    ws = await self._connector.websocket(
                        self._connector.service_url, "lookup", self.topic, "", {}
                    )
                async with ws:
                    delay = 0.05
                    async for message in ws:
                        if message.type is aiohttp.WSMsgType.TEXT:
                            self._take(json.loads(message.data))
            except TopicNotFound:
                log.warning("%s was deleted: no more layout updates", self.topic)
                return
            except (Unauthenticated, NotAuthorized) as e:
                # the token expired or the rights went: trying again will not pass (the
                # segments' own connections hand the error to the application)
                log.warning(
                    "lookup session of %s refused (%s): no more layout updates", self.topic, e
                )
                return
            except CertificateError as e:  # retrying cannot help: say so, not wait for nothing
                log.warning("lookup session of %s: %s: no more layout updates", self.topic, e)
                self.failed = e
                self._wake()
                return
            except ServerError as e:
                log.info("lookup session of %s failed (%s); reconnecting", self.topic, e)
            except (aiohttp.ClientError, ConnectionError, TimeoutError) as e:
                log.info("lookup session of %s dropped (%r); reconnecting", self.topic, e)
                self._connector.unreachable(self._connector.service_url)
            await asyncio.sleep(delay)  # back off before reconnecting
            delay = min(delay * 2, 2.0)

    def _take(self, pushed: dict[str, Any]) -> None:
        """Apply a DAG the session pushed, or log the error frame it sent instead (the
        topic's record does not read now: the DAG held stays, and a repaired record's
        comes on the same session)."""
        if "error" not in pushed:
            self.apply(pushed)
            return
        said = f"{pushed['error']}: {pushed.get('message', '')}"
        if said != self._said:
            log.warning(
                "lookup session of %s: %s; keeping the layout of epoch %d until it reads",
                self.topic, said, self.epoch,
            )  # fmt: skip
            self._said = said

    def pruned(self, segment_id: int) -> bool:
        """Whether ``segment_id`` was a segment of this topic that has left its DAG
        (retired, then pruned from the topic's record): not in the DAG, and below its
        newest id. Ids are given in increasing order and never reused, and the newest
        segment is never pruned (only a sealed one retires, and its children are newer),
        so an id above the newest is one this layout has not seen yet, never a pruned
        one."""
        return (
            bool(self.segments)
            and segment_id not in self.segments
            and segment_id < max(self.segments)
        )

    def route(self, key: str | None, round_robin: int) -> int:
        """The active segment for ``key`` (round-robin when there is none)."""
        active = self._active
        if not active:
            raise ServiceNotReady(f"{self.topic} has no active segment")
        if key is None:
            return active[round_robin % len(active)].id
        h = key_hash(key)
        for segment in active:
            if segment.lo <= h <= segment.hi:
                return segment.id
        raise UnknownError(f"no active segment of {self.topic} covers {h:#06x}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
