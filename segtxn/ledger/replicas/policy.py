"""How many copies: the write and ack quorums every replicated ledger of a process uses.

Brokers and coordinators both write replicated ledgers (topics' ledgers, and v4
transaction logs) on the brokers' storage nodes, so both parse ``--replication W/A`` into a
:class:`Replication`, and both check it with :func:`check_quorums`, the one rule recovery
needs (:mod:`segtxn.ledger.replicas.storage` explains why ``2A <= W + 1``).
"""

from __future__ import annotations

from dataclasses import dataclass


def check_quorums(write_quorum: int, ack_quorum: int) -> None:
    """Raises ValueError unless ``1 <= A <= W`` and ``2A <= W + 1``."""
    if not 1 <= ack_quorum <= write_quorum or 2 * ack_quorum > write_quorum + 1:
        raise ValueError(
            f"replication {write_quorum}/{ack_quorum}: the ack quorum must be at least 1, at "
            "most the write quorum, and at most a majority of it (2A <= W + 1; e.g. 3/2, 2/1, "
            "1/1)"
        )


@dataclass(frozen=True)
class Replication:
    """Every new ledger goes to ``write_quorum`` brokers' storage nodes and an entry is
    acknowledged once ``ack_quorum`` of them synced it."""

    write_quorum: int
    ack_quorum: int
    timeout_s: float = 5.0
    """How long a storage node may take to answer before it is taken for gone."""

    def __post_init__(self) -> None:
        check_quorums(self.write_quorum, self.ack_quorum)
        if self.timeout_s <= 0:
            raise ValueError("the replication timeout must be positive")

    @classmethod
    def parse(cls, text: str) -> Replication:
        """``"W/A"``, e.g. ``"3/2"``. Raises ValueError."""
        write, slash, ack = text.partition("/")
        if not slash or not write.isdigit() or not ack.isdigit():
            raise ValueError(f"replication {text!r}: write it W/A, e.g. 3/2")
        return cls(int(write), int(ack))

    def __str__(self) -> str:
        return f"{self.write_quorum}/{self.ack_quorum}"
