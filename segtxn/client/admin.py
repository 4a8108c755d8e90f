"""Topic administration through the brokers' REST API."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from segtxn.client.connection import Connector
from segtxn.client.errors import Timeout
from segtxn.protocol import errors, names
from segtxn.protocol.names import TopicName, check_list_part
from segtxn.protocol.preconditions import PropertyPrecondition

_LISTED_DOMAINS = ("persistent", "topic")
"""The domains whose topics a namespace lists (a segment is listed with its topic)."""

__all__ = ["Admin", "BrokerHomes"]


@dataclass(frozen=True)
class BrokerHomes:
    """What a broker holds: the topics and segments homed on it (their data is on its
    disk), at most the number asked for; ``more`` when there are others."""

    broker: str
    homes: list[str]
    more: bool
    registered: bool = True
    """Whether a broker of that id is registered (alive) now: a typo holds nothing either."""

    @property
    def empty(self) -> bool:
        return not self.homes and not self.more


class Admin:
    def __init__(self, connector: Connector) -> None:
        self._c = connector

    @staticmethod
    def _path(topic: str) -> str:
        try:
            return "/admin/v2/" + TopicName.parse(topic).path
        except names.InvalidTopicName as e:
            raise errors.InvalidTopicName(str(e)) from e

    async def create_topic(self, topic: str, *, segments: int | None = None) -> None:
        """Create ``persistent://...`` or ``topic://...`` (with ``segments`` range segments,
        1 by default).

        Raises:
            ServerError: TopicAlreadyExists; InvalidArgument for ``segments`` outside 1..256,
                or given for a persistent topic (it has none: the broker refuses rather than
                ignore it).
        """
        params = {} if segments is None else {"segments": str(segments)}
        await self._c.request("PUT", self._path(topic), params=params)

    async def delete_topic(
        self,
        topic: str,
        *,
        force: bool = False,
        precondition: PropertyPrecondition | None = None,
    ) -> None:
        """Delete a topic and its data (a ``topic://``: every segment's).

        Args:
            force: delete it even with producers or consumers connected (they are
                disconnected); without it, connected clients make it ConsumerBusy.
            precondition: delete it only if its property holds this value (or, made with
                :meth:`PropertyPrecondition.absent`, is not set). The broker checks it in
                the store step that commits to the deletion, so a topic deleted and created
                again by someone else since the caller looked at it is not deleted (a
                ``topic://`` only: a persistent topic refuses it with NotAllowed).

        Raises:
            PreconditionFailed: the topic does not satisfy ``precondition``; nothing was
                deleted (read the topic again to see why).
            ServerError: TopicNotFound; ConsumerBusy; InvalidArgument for a malformed
                precondition (an empty key or value, one over the property limits);
                NotAllowed for a precondition on a persistent topic or a segment.
            Timeout: no answer in time (outcome unknown: it may have been deleted).
        """
        params = {"force": "true"} if force else {}
        if precondition is not None:
            params |= precondition.params()
        await self._c.request("DELETE", self._path(topic), params=params)

    async def list_topics(self, domain: str, tenant: str, namespace: str) -> list[str]:
        """The topics of ``domain`` (``"persistent"`` or ``"topic"``) in tenant/namespace.

        Raises ServerError(InvalidTopicName) for another domain (``"persistent://"``
        included), or a tenant or namespace no topic can have, before any request."""
        if domain not in _LISTED_DOMAINS:
            raise errors.InvalidTopicName(
                f"topics are listed by domain persistent or topic, not {domain[:40]!r}"
            )
        try:
            check_list_part("tenant", tenant)
            check_list_part("namespace", namespace)
        except names.InvalidTopicName as e:
            raise errors.InvalidTopicName(str(e)) from e
        return list(await self._c.request("GET", f"/admin/v2/{domain}/{tenant}/{namespace}"))

    async def stats(self, topic: str) -> dict[str, Any]:
        return dict(await self._c.request("GET", self._path(topic) + "/stats"))

    async def segment_stats(self, topic: str) -> dict[str, Any]:
        """A ``topic://`` topic's statistics read segment by segment, each from its own
        broker, for when :meth:`stats` fails whole because one segment's broker is down.

        Returns:
            :meth:`stats`'s shape (``lastChange`` unknown: None); a segment whose broker
            could not be reached has ``stats`` None and ``unreachable`` saying why (a
            RETIRED one has neither: its data is gone).

        Raises:
            ServerError, Timeout: the topic's segments could not be looked up.
        """
        name = TopicName.parse(topic)
        layout = await self._c.lookup(name)

        async def one(segment: dict[str, Any]) -> dict[str, Any]:
            found: dict[str, Any] = {
                "id": segment["id"],
                "range": [segment["lo"], segment["hi"]],
                "state": segment["state"],
                "parents": segment["parents"],
                "children": segment["children"],
                "stats": None,
            }
            url = segment.get("brokerUrl")
            if segment["state"] == "RETIRED":
                return found
            if not url:
                found["unreachable"] = "its broker is down (not registered)"
                return found
            path = "/admin/v2/" + name.segment_name(int(segment["id"])).path + "/stats"
            try:
                found["stats"] = await self._c.request("GET", url + path)
            except (errors.ServerError, Timeout) as e:
                found["unreachable"] = (
                    str(e) if isinstance(e, errors.ServerError) else f"Timeout: {e}"
                )
            return found

        segments = await asyncio.gather(*(one(s) for s in layout["segments"]))
        return {
            "topic": str(name),
            "epoch": layout["epoch"],
            "segments": segments,
            "activeSegments": sum(s["state"] == "ACTIVE" for s in segments),
            "lastChange": None,
        }

    async def subscriptions(self, topic: str) -> list[str]:
        return list(await self._c.request("GET", self._path(topic) + "/subscriptions"))

    async def create_subscription(
        self, topic: str, subscription: str, *, initial_position: str = "latest"
    ) -> None:
        await self._c.request(
            "PUT",
            f"{self._path(topic)}/subscription/{subscription}",
            params={"initial": initial_position},
        )

    async def delete_subscription(self, topic: str, subscription: str) -> None:
        await self._c.request("DELETE", f"{self._path(topic)}/subscription/{subscription}")

    async def reset_subscription(self, topic: str, subscription: str, to: str) -> None:
        """Move to ``earliest``, ``latest`` or ``LEDGER:ENTRY``."""
        await self._c.request(
            "POST", f"{self._path(topic)}/subscription/{subscription}/reset", params={"to": to}
        )

    async def repair_cursor(
        self, topic: str, subscription: str, *, to: str = "earliest"
    ) -> dict[str, Any]:
        """Rewrite the subscription's cursor record when it does not read (the topic is
        refused with PersistenceError naming it), so that the topic loads again: the
        subscription restarts at the first retained message (``to="earliest"``: every
        retained message is delivered again, none lost) or at ``LEDGER:ENTRY``. Only a
        damaged record is replaced, and only as it was read. ``topic`` is a
        ``persistent://`` topic or the ``segment://`` the error names.

        Returns:
            ``{"topic", "subscription", "key", "start", "replaced": {"reason", "bytes"}}``.

        Raises:
            ServerError: NotAllowed when the record reads (use :meth:`reset_subscription`)
                or for a ``topic://``; TopicNotFound; SubscriptionNotFound;
                PreconditionFailed when the record changed while it was being repaired
                (nothing written: look again); InvalidArgument for a ``to`` past the end.
        """
        path = f"{self._path(topic)}/subscription/{subscription}/repair"
        return dict(await self._c.request("POST", path, params={"to": to}))

    async def split(self, topic: str, segment: int, *, at: int | None = None) -> dict[str, Any]:
        """Split a segment of a scalable topic (at hash ``at``, or its midpoint); returns
        the new DAG. Raises ServerError (InvalidArgument, TopicBusy, TopicNotFound);
        ServiceNotReady from a connection that broke after the request went out, or a
        Timeout (OUTCOME_UNKNOWN), means it may or may not have happened (once planned, a
        broker's sweep finishes it): :meth:`stats` shows the segments and the last change."""
        params = {"segment": str(segment)} | ({"at": str(at)} if at is not None else {})
        return dict(await self._c.request("POST", self._path(topic) + "/split", params=params))

    async def merge(self, topic: str, first: int, second: int) -> dict[str, Any]:
        """Merge two adjacent active segments; returns the new DAG (errors as
        :meth:`split`'s)."""
        params = {"segments": f"{first},{second}"}
        return dict(await self._c.request("POST", self._path(topic) + "/merge", params=params))

    async def terminate(self, topic: str) -> dict[str, Any]:
        """Seal a persistent topic or a segment: no more writes."""
        return dict(await self._c.request("POST", self._path(topic) + "/terminate"))

    async def trim(self, topic: str) -> dict[str, Any]:
        """Apply the brokers' retention policy to a topic now, as their periodic pass does
        (each segment of a ``topic://``); returns what each trimmed."""
        return dict(await self._c.request("POST", self._path(topic) + "/trim"))

    async def properties(self, topic: str) -> dict[str, str]:
        return dict(await self._c.request("GET", self._path(topic) + "/properties"))

    async def update_properties(self, topic: str, properties: dict[str, str]) -> None:
        await self._c.request("PUT", self._path(topic) + "/properties", json=properties)

    async def remove_property(self, topic: str, key: str) -> None:
        await self._c.request("DELETE", self._path(topic) + "/properties", params={"key": key})

    async def broker_homes(self, broker: str, *, limit: int = 100) -> BrokerHomes:
        """The topics and segments homed on ``broker`` (alive or not), at most ``limit``
        (1..1000). Without replication, removing a broker strands their data.

        Raises:
            ServerError: InvalidArgument for an id no broker can have or a bad ``limit``.
        """
        found = await self._c.request(
            "GET", f"/admin/v2/brokers/{quote(broker, safe='')}/homes", params={"limit": str(limit)}
        )
        homes = [str(h) for h in found["homes"]]
        registered = bool(found.get("registered", True))  # (a broker before it said)
        return BrokerHomes(str(found["broker"]), homes, bool(found["more"]), registered)

    async def drain_broker(self, broker: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        """Hand every topic and segment ``broker`` holds to the other brokers (it must run
        with replication), and place nothing new on it until :meth:`undrain_broker` or its
        restart. Returns ``{"broker", "moved": [names], "failed": {name: why}}``.

        Raises:
            ServerError: NotAllowed without replication; InvalidArgument when the broker is
                not registered (a typo, or it is gone); ServiceNotReady when no other broker
                can take its topics.
        """
        path = f"/admin/v2/brokers/{quote(broker, safe='')}/drain"
        return dict(await self._c.request("POST", path, timeout_s=timeout_s))

    async def undrain_broker(self, broker: str) -> None:
        """Let new topics be placed on ``broker`` again.

        Raises:
            ServerError: InvalidArgument when the broker is not registered now (a typo; or
                gone: it starts undrained; or its registration lost while it runs: it comes
                back still draining, undrain it then).
        """
        await self._c.request("DELETE", f"/admin/v2/brokers/{quote(broker, safe='')}/drain")
