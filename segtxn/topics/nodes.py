"""The storage nodes a replicated ledger may use: the brokers the catalog has registered.

Every broker started with ``--replication`` runs a storage node and registers its instance
in its broker record (``/brokers/<id>``); those are the members a writer may put a new
ledger's replicas on. Brokers write their topics' ledgers there (with their own node in the
ensemble, first), and coordinators their v4 transaction logs (with no node of their own).

A broker's URL is looked up in the store and kept for :data:`URL_TTL_S` (a broker that
restarts may come back elsewhere), and the last one known is used while the store does
not answer: writes to replicas must not stop when the metadata store restarts.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import aiohttp

from segtxn.ledger.replicas import HttpReplica, LocalReplica, Member, Replica, ReplicaUnavailable
from segtxn.metastore import MetadataStoreError
from segtxn.topics.catalog import Catalog

URL_TTL_S = 5.0


class CatalogNodes:
    """The registered brokers' storage nodes (the ``Nodes`` a replicated storage uses).

    ``local``: the node in this process, if it has one (a broker's; a coordinator has none):
    it is called directly, and the storage puts it first in every ensemble.
    """

    def __init__(
        self,
        catalog: Catalog,
        timeout_s: float,
        local: LocalReplica | None = None,
        session: Callable[[], aiohttp.ClientSession] = aiohttp.ClientSession,
    ) -> None:
        """``session`` makes the HTTP session for calls to other brokers' nodes (a server's
        cluster session when security is on: the cluster role's token, TLS)."""
        self._catalog = catalog
        self._timeout_s = timeout_s
        self._new_session = session
        self._local_replica = local
        self.local: Member | None = None if local is None else local.member
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[str, tuple[float, str | None]] = {}

    async def start(self) -> None:
        self._session = self._new_session()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def alive(self) -> list[Member]:
        """The members new replicas go on: live brokers with a storage node, not draining
        (nothing new is placed on a broker being drained: docs/ledger.md, Drain)."""
        brokers = await self._catalog.brokers()
        return [Member(b.broker_id, b.instance) for b in brokers if b.instance and not b.draining]

    def replica(self, member: Member) -> Replica:
        if self._local_replica is not None and member == self.local:
            return self._local_replica
        if self._session is None:
            raise RuntimeError("CatalogNodes used before start()")
        return HttpReplica(member, self._locate, self._session, timeout_s=self._timeout_s)

    async def _locate(self, broker: str) -> str | None:
        """``broker``'s URL: from the store at most every :data:`URL_TTL_S`, and the last
        one known while the store does not answer.

        Raises:
            ReplicaUnavailable: the store does not answer and no URL is known yet.
        """
        now = time.monotonic()
        cached = self._urls.get(broker)
        if cached is not None and now - cached[0] < URL_TTL_S:
            return cached[1]
        try:
            url = await self._catalog.broker_url(broker)
        except MetadataStoreError as e:
            if cached is not None:
                return cached[1]
            raise ReplicaUnavailable(f"where broker {broker} is: {e}") from e
        self._urls[broker] = (now, url)
        return url
