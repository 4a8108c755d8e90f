"""Replicas as a writer sees them: who the storage nodes are, and one call per operation.

A :class:`Member` names one storage node instance (``<broker id>@<instance>``, the form
the ledger metadata records). A :class:`Replica` is the client of one member: the node in
this process (:class:`LocalReplica`, no network) or another broker's over HTTP
(:mod:`segtxn.ledger.replicas.wire`). A :class:`Nodes` directory says which members are
alive to choose an ensemble from, and hands out their replicas.

Errors a writer meets: :class:`ReplicaUnavailable` (the member did not answer, timed out, or
is another instance now: treat it as gone), ``ReplicaFenced``, ``ReplicaGap``, and
``LedgerCorrupted``/``LedgerMissing`` for a replica that is damaged or absent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from segtxn.ledger.errors import LedgerError
from segtxn.ledger.replicas.node import ReplicaNode


class ReplicaUnavailable(LedgerError):
    """A storage node did not answer (down, unreachable, too slow) or is not the instance
    the ledger names (it was emptied). Retriable: its ledgers are served by the others."""

    retriable = True


class ReplicaBehind(LedgerError):
    """A read asked a replica for entries it does not hold (it lags behind the others)."""


class Member(NamedTuple):
    broker: str
    instance: str

    def __str__(self) -> str:
        return f"{self.broker}@{self.instance}"

    @classmethod
    def parse(cls, text: str) -> Member:
        """Raises ValueError for anything but ``<broker id>@<instance>``."""
        broker, at, instance = text.rpartition("@")
        if not at or not broker or not instance:
            raise ValueError(f"{text!r} is not a replica (<broker id>@<instance>)")
        return cls(broker, instance)


NO_CLAIM = 0
"""The claim of a create whose node answered none (a node of an earlier version): its
replica is never discarded, only swept."""


class Replica(Protocol):
    """One member's replicas, as coroutines (a node's answers or its errors)."""

    member: Member

    async def create(self, name: str, ledger_id: int) -> int:
        """Make the empty replica (idempotent while empty); returns this create's claim,
        for :meth:`discard` (:meth:`ReplicaNode.create`), or :data:`NO_CLAIM`."""
        ...

    async def append(
        self, name: str, ledger_id: int, first: int, payloads: Sequence[bytes], *, recovery: bool
    ) -> int: ...

    async def fence(self, name: str, ledger_id: int) -> tuple[int, int]: ...

    async def stat(self, name: str, ledger_id: int) -> tuple[int, int]:
        """The (count, size) the replica holds, changing nothing; ``LedgerMissing`` if
        the member has no such replica."""
        ...

    async def read(self, name: str, ledger_id: int, first: int, last: int) -> list[bytes]:
        """Entries from ``first``: all up to ``last``, or fewer (at least one) when they
        are many bytes; ``ReplicaBehind`` if the replica does not hold ``first``."""
        ...

    async def delete(self, name: str, ledger_id: int) -> None: ...

    async def discard(self, name: str, ledger_id: int, claim: int) -> bool:
        """Remove the replica made by the create that answered ``claim``, if no one else
        can use it; whether it was (:meth:`ReplicaNode.discard`)."""
        ...


class Nodes(Protocol):
    """The storage nodes a writer may use."""

    local: Member | None
    """The node in this process, if there is one (it is always first in an ensemble)."""

    async def alive(self) -> list[Member]:
        """The members that can take a new ledger now (registered and reachable)."""
        ...

    def replica(self, member: Member) -> Replica:
        """The client of ``member`` (whether or not it is alive: calls fail if not)."""
        ...


class LocalReplica:
    """The node in this process, called directly on its own threads."""

    def __init__(self, node: ReplicaNode, broker: str) -> None:
        self.node = node
        self.member = Member(broker, node.instance)

    async def create(self, name: str, ledger_id: int) -> int:
        return await self.node.run(self.node.create, name, ledger_id)

    async def append(
        self, name: str, ledger_id: int, first: int, payloads: Sequence[bytes], *, recovery: bool
    ) -> int:
        return await self.node.run(self.node.append, name, ledger_id, first, payloads, recovery)

    async def fence(self, name: str, ledger_id: int) -> tuple[int, int]:
        return await self.node.run(self.node.fence, name, ledger_id)

    async def stat(self, name: str, ledger_id: int) -> tuple[int, int]:
        return await self.node.run(self.node.stat, name, ledger_id)

    async def read(self, name: str, ledger_id: int, first: int, last: int) -> list[bytes]:
        try:
            return await self.node.run(self.node.read, name, ledger_id, first, last)
        except IndexError as e:
            raise ReplicaBehind(f"{self.member}: {e}") from None

    async def delete(self, name: str, ledger_id: int) -> None:
        await self.node.run(self.node.delete, name, ledger_id)

    async def discard(self, name: str, ledger_id: int, claim: int) -> bool:
        return await self.node.run(self.node.discard, name, ledger_id, claim)
