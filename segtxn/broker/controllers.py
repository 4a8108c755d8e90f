"""Scalable-topic controllers on the brokers: who decides splits and merges, and how.

The controller of a topic is the broker holding ``/segtxn/elections/topic-controller-<topic>``
(an ephemeral key on its session, valued with its URL). A broker asked to split or merge
takes that key if it is free, or forwards the request to the holder. Segment work goes to
each segment's home broker through the admin API (:class:`HttpSegmentOps`). A sweep, every
``controller_sweep_s``, finishes operations left pending by a controller that died: the
first broker to take the free key completes them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import aiohttp

from segtxn.broker.metrics import BrokerMetrics
from segtxn.ledger.errors import report_once
from segtxn.metastore import (
    MUST_NOT_EXIST,
    AlreadyExists,
    MetadataStore,
    MetadataStoreError,
    Session,
)
from segtxn.metastore.election import ELECTIONS_PREFIX
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.names import TopicName
from segtxn.topics.catalog import TOPICS, Catalog
from segtxn.topics.controller import Controller
from segtxn.topics.model import DamagedRecord, ScalableTopic, read_topic

log = logging.getLogger(__name__)

CONTROLLER_ELECTIONS = ELECTIONS_PREFIX + "topic-controller-"


class HttpSegmentOps:
    """SegmentOps through the admin API of each segment's home broker."""

    def __init__(self, catalog: Catalog, http: aiohttp.ClientSession) -> None:
        self._catalog = catalog
        self._http = http

    async def _url(self, segment: TopicName) -> str:
        home = await self._catalog.home_of(segment)
        url = await self._catalog.broker_url(home) if home else None
        if url is None:
            raise ServerError(ErrorName.SERVICE_NOT_READY, f"{segment}'s broker is down")
        return f"{url}/admin/v2/{segment.path}"

    async def _call(self, method: str, url: str, **kwargs: Any) -> Any:
        """Raises ServerError: the peer's answer, or ServiceNotReady (retriable) when the
        peer cannot be reached (it may be restarting; its registration outlives it until
        its session expires)."""
        try:
            async with self._http.request(method, url, **kwargs) as response:
                text = await response.text()
                if response.status >= 400:
                    name = response.headers.get("X-Segtxn-Error", ErrorName.UNKNOWN.value)
                    try:
                        error = ErrorName(name)
                    except ValueError:
                        error = ErrorName.UNKNOWN
                    raise ServerError(error, f"{method} {url}: {text}")
                return await response.json() if text else None
        except (aiohttp.ClientConnectionError, TimeoutError) as e:
            raise ServerError(
                ErrorName.SERVICE_NOT_READY, f"{method} {url}: the broker did not answer ({e})"
            ) from e

    async def subscriptions(self, segment: TopicName) -> list[str]:
        return list(await self._call("GET", await self._url(segment) + "/subscriptions"))

    async def prepare(self, segment: TopicName, subscriptions: list[str]) -> None:
        base = await self._url(segment)
        await self._call("POST", base + "/load")
        for subscription in subscriptions:
            await self._call(
                "PUT", f"{base}/subscription/{subscription}", params={"initial": "earliest"}
            )

    async def seal(self, segment: TopicName) -> None:
        await self._call("POST", await self._url(segment) + "/terminate")


class TopicControllers:
    def __init__(
        self,
        store: MetadataStore,
        catalog: Catalog,
        *,
        advertise_url: str,
        sweep_s: float,
        session: Callable[[], Session],
        metrics: BrokerMetrics,
    ) -> None:
        """``session``: the broker's current session (controller keys live on it)."""
        self._store = store
        self._catalog = catalog
        self._url = advertise_url
        self._sweep_s = sweep_s
        self._session = session
        self._metrics = metrics
        self._http: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._locks: dict[TopicName, asyncio.Lock] = {}

    def start(self, http: aiohttp.ClientSession) -> None:
        self._http = http
        self._task = asyncio.create_task(self._sweep(), name="topic-controller-sweep")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def segment_ops(self) -> HttpSegmentOps:
        """Admin calls on segments through their home brokers.

        Raises ServerError(ServiceNotReady) before the broker has started."""
        if self._http is None:
            raise ServerError(ErrorName.SERVICE_NOT_READY, "the broker is starting")
        return HttpSegmentOps(self._catalog, self._http)

    def _controller(self) -> Controller:
        return Controller(self._store, self._catalog, self.segment_ops())

    async def leader(self, name: TopicName) -> str | None:
        """Take the topic's controller key if it is free; the holder's URL otherwise
        (None: this broker is the controller)."""
        key = CONTROLLER_ELECTIONS + quote(str(name), safe="")
        try:
            await self._store.put(
                key, self._url.encode(), expected_version=MUST_NOT_EXIST, session=self._session()
            )
            log.info("controller of %s: this broker (%s) took the lease", name, self._url)
            return None
        except AlreadyExists:
            record = await self._store.get(key)
            if record is None:
                return await self.leader(name)  # released meanwhile: try again
            url = record.value.decode()
            if url == self._url:
                return None
            log.debug("controller of %s is %s: forwarding", name, url)
            return url

    def lock(self, name: TopicName) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def split(self, name: TopicName, segment: int, at: int | None) -> ScalableTopic:
        async with self.lock(name):
            controller = self._controller()
            await controller.finish(name)
            done = await controller.split(name, segment, at)
        self._count(done)
        return done

    async def merge(self, name: TopicName, first: int, second: int) -> ScalableTopic:
        async with self.lock(name):
            controller = self._controller()
            await controller.finish(name)
            done = await controller.merge(name, first, second)
        self._count(done)
        return done

    def _count(self, done: ScalableTopic) -> None:
        change = done.last_change
        if change is not None:
            self._metrics.topology_changes.add(1, {"kind": change.kind.value})
            self._metrics.topology_change_seconds.record(change.duration_ms / 1000)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self._sweep_s)  # a schedule, not a wait for a condition
            try:
                await self.sweep_once()
            except (MetadataStoreError, ServerError) as e:
                log.warning("controller sweep failed: %s", e)
            except Exception:
                log.exception("controller sweep failed")

    async def sweep_once(self) -> None:
        """One round of the sweep: finish every scalable topic's pending split or merge
        whose controller key is free (or this broker's).

        A topic whose round fails is skipped until the next round, and the others are
        swept: a record that does not decode (:class:`DamagedRecord`, stored data that
        stays damaged until an operator acts) is reported at ERROR once by key, without a
        traceback (:func:`report_once`); a store or peer failure finishing one topic is a
        WARNING.

        Raises:
            MetadataStoreError: the topics could not be listed.
        """
        listing = await self._store.list_prefix(TOPICS + "topic/")
        for record in listing.records:
            try:
                topic = read_topic(record.key, record.value)
            except DamagedRecord as e:
                report_once(log, e, "controller sweep: skipping a topic: %s", e)
                continue
            if not isinstance(topic, ScalableTopic) or topic.pending is None:
                continue
            if topic.deleting:  # its deletion stops the change (Controller.finish)
                continue
            name = TopicName.from_path(record.key[len(TOPICS) :], check_lengths=False)
            try:
                if await self.leader(name) is None:
                    async with self.lock(name):
                        await self._controller().finish(name)
            except (MetadataStoreError, ServerError) as e:
                log.warning("controller sweep: %s stays pending until the next round: %s", name, e)
