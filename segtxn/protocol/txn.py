"""Transaction ids and the coordinator's wire commands.

A transaction id is 128 bits, ``(most, least)``: ``most`` is the id of the coordinator that
created it, ``least`` a number that coordinator never reuses. v5 (metadata-driven)
coordinators have ids in their own range, at and above :data:`V5_COORDINATOR_BASE`, so a
v5 id can never be taken for a v4 (marker-based) one, or the reverse: the version is read
off the id.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from typing import NamedTuple

from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.names import Domain, TopicName

V5_COORDINATOR_BASE = 1 << 48
"""v5 coordinator ids are V5_COORDINATOR_BASE + n; v4 ids are below it."""
MAX_ID = (1 << 64) - 1

_TEXT = re.compile(r"([0-9a-f]{1,16}):([0-9a-f]{1,16})")  # fullmatch: "$" would take a "\n"


class TxnId(NamedTuple):
    most: int
    least: int

    @property
    def is_v5(self) -> bool:
        return self.most >= V5_COORDINATOR_BASE

    def __str__(self) -> str:
        return f"{self.most:x}:{self.least:x}"

    @property
    def key(self) -> str:
        """Fixed-width form for store keys (sorts like the id)."""
        return f"{self.most:016x}-{self.least:016x}"

    @classmethod
    def parse(cls, text: str) -> TxnId:
        """``"1000000000000:2a"`` -> TxnId. Raises ValueError for anything else."""
        match = _TEXT.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            raise ValueError(f"not a transaction id: {text!r} (expected MOST:LEAST in hex)")
        return cls(int(match[1], 16), int(match[2], 16))

    @classmethod
    def from_key(cls, key: str) -> TxnId:
        most, _, least = key.partition("-")
        return cls(int(most, 16), int(least, 16))


class TxnState(enum.StrEnum):
    OPEN = "OPEN"
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"

    @property
    def final(self) -> bool:
        return self is not TxnState.OPEN


class TxnAction(enum.StrEnum):
    COMMIT = "COMMIT"
    ABORT = "ABORT"

    @property
    def outcome(self) -> TxnState:
        return TxnState.COMMITTED if self is TxnAction.COMMIT else TxnState.ABORTED


def check_participants(topics: Iterable[str], *, v5: bool) -> list[TopicName]:
    """The names of ``topics``, each able to take part in a v5 transaction (scalable topics)
    or a v4 one (``persistent://`` topics): one transaction never mixes the two.

    Raises:
        ServerError(InvalidTopicName / NotAllowed)
    """
    names = []
    for topic in topics:
        try:
            name = TopicName.parse(topic)
        except ValueError as e:
            raise ServerError(ErrorName.INVALID_TOPIC_NAME, str(e)) from e
        if (name.domain is Domain.PERSISTENT) == v5:
            raise ServerError(
                ErrorName.NOT_ALLOWED,
                f"{topic}: v5 transactions run on scalable topics (topic://, segment://); "
                "persistent:// topics take part in v4 (marker-based) transactions"
                if v5
                else f"{topic}: v4 transactions run on persistent:// topics; scalable topics "
                "take part in v5 transactions (one transaction never mixes the two)",
            )
        names.append(name)
    return names
