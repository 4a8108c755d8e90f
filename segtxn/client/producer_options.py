"""What a producer is configured and named by: :class:`ProducerOptions` (the settings an
application passes to ``client.create_producer()``) and the process-unique names of
producers that are not given one.

Both a :class:`~segtxn.client.producer.Producer` and a
:class:`~segtxn.client.scalable.ScalableProducer` (which holds one Producer per segment)
take them, so they live beneath both rather than inside the machinery of either: the
options are the producer's documented settings, read once, and nothing in them sends.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from segtxn.client.timeouts import checked_limit
from segtxn.protocol.limits import MAX_BATCH_SENDS

__all__ = ["ProducerOptions", "new_name"]

_names = itertools.count(1)


def new_name(owner: object) -> str:
    """A producer name unique in this process."""
    return f"producer-{next(_names)}-{id(owner):x}"


@dataclass(frozen=True)
class ProducerOptions:
    batching: bool = True
    batch_max_messages: int = 1000
    batch_max_bytes: int = 1024 * 1024
    batch_delay_s: float = 0.0
    max_pending: int = 1000
    reconnect_max_s: float = 2.0
    send_timeout_s: float = 30.0
    """A send not done this long after the call fails with
    :class:`~segtxn.client.errors.Timeout` and is not sent again: OUTCOME_UNKNOWN once it
    was queued (it may still be stored), RETRIABLE when it never left (no room in the
    window, or its transaction could not register it). Pulsar's ``sendTimeout`` (30 s). 0:
    wait as long as it takes."""

    def __post_init__(self) -> None:
        checked_limit(self.send_timeout_s, "send_timeout_s")
        if self.max_pending < 1:
            raise ValueError("max_pending must be >= 1")
        if not 1 <= self.batch_max_messages <= MAX_BATCH_SENDS:
            # a larger batch is refused whole by the broker, no send of it answered
            raise ValueError(
                f"batch_max_messages must be in 1..{MAX_BATCH_SENDS} (the sends a broker "
                f"takes in one batch), not {self.batch_max_messages}"
            )

    @property
    def send_limit_s(self) -> float | None:
        return self.send_timeout_s or None
