"""Who is attached to one subscription, and which consumer is active.

- **Exclusive**: one consumer; a second is refused (``ConsumerBusy``).
- **Failover**: many consumers. Members (and held places) are ordered by name; segment ``i``
  of a scalable topic goes to member ``i mod n`` (a persistent topic counts as segment 0), so
  a topic's segments are shared out among the members, each to one of them, as Pulsar does
  with partitions. A member whose connection *dropped* (rather than closed) keeps its place
  for ``hold_s``: its segments wait for it to come back under its name instead of moving.
- **Shared**: everyone is active; there is no order to keep.

The subscription asks :meth:`Members.active` before and after each change and handles the
hand-over (fencing, rewinding, telling the members).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable

from segtxn.broker.delivery import ConsumerLink
from segtxn.protocol.errors import ErrorName, ServerError


class SubscriptionType(enum.StrEnum):
    EXCLUSIVE = "Exclusive"
    FAILOVER = "Failover"
    SHARED = "Shared"


class Members:
    def __init__(
        self,
        name: str,
        index: int,
        hold_s: float,
        on_place_released: Callable[[ConsumerLink | None], None],
    ) -> None:
        """``on_place_released(before)`` is called when a held place expires, with the
        consumer that was active before."""
        self._name = name
        self._index = index
        self.hold_s = hold_s
        self._on_place_released = on_place_released
        self.type: SubscriptionType | None = None
        self.consumers: list[ConsumerLink] = []
        self._held: dict[str, tuple[ConsumerLink, asyncio.TimerHandle]] = {}
        """Failover members that dropped off, keeping their place until they return."""

    def add(self, link: ConsumerLink, sub_type: SubscriptionType) -> None:
        """Raises ServerError(ConsumerBusy): the subscription is Exclusive and taken, or has
        consumers of another type."""
        if self.consumers and self.type is not sub_type:
            raise ServerError(
                ErrorName.CONSUMER_BUSY,
                f"subscription {self._name!r} has {self.type} consumers; cannot add {sub_type}",
            )
        if sub_type is SubscriptionType.EXCLUSIVE and self.consumers:
            raise ServerError(
                ErrorName.CONSUMER_BUSY, f"subscription {self._name!r} already has a consumer"
            )
        self.type = sub_type
        held = self._held.pop(link.name, None)
        if held is not None:  # back in time: its place (and its segments) are its own again
            held[1].cancel()
        self.consumers.append(link)

    def remove(self, link: ConsumerLink, *, dropped: bool) -> bool:
        """Remove ``link``; returns whether its place is held for it (a Failover member
        whose connection ``dropped``)."""
        self.consumers.remove(link)
        if not (
            dropped
            and self.hold_s > 0
            and self.type is SubscriptionType.FAILOVER
            and link.name not in self._held
            and all(c.name != link.name for c in self.consumers)
        ):
            return False
        placeholder = ConsumerLink(link.name, lambda _frame: None)
        timer = asyncio.get_running_loop().call_later(self.hold_s, self._release, link.name)
        self._held[link.name] = (placeholder, timer)
        return True

    def _release(self, name: str) -> None:
        """A dropped member did not come back in time: its segments move on."""
        if name not in self._held:
            return
        before = self.active()
        del self._held[name]
        self._on_place_released(before)

    def active(self) -> ConsumerLink | None:
        """The consumer that receives everything (Exclusive, Failover: possibly a held
        place, which has no permits, so nothing is dispatched to it); None for Shared."""
        if self.type is SubscriptionType.SHARED:
            return None
        if self.type is SubscriptionType.EXCLUSIVE:
            return self.consumers[0] if self.consumers else None
        members = self.consumers + [placeholder for placeholder, _ in self._held.values()]
        if not members:
            return None
        members.sort(key=lambda c: (c.name, c.id))
        return members[self._index % len(members)]

    def is_active(self, link: ConsumerLink) -> bool:
        return self.type is SubscriptionType.SHARED or self.active() is link

    def close(self) -> None:
        for _, timer in self._held.values():
            timer.cancel()
        self._held.clear()
