"""The settings of one metadata store client: limits, retries, cache size, timeouts.

Given once, at start-up, to :func:`segtxn.metastore.open_store` (or
:class:`~segtxn.metastore.store.MetadataStore`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StoreSettings:
    """Limits and tuning of one store client."""

    max_value_bytes: int = 1024 * 1024
    """A record value larger than this is refused with ``TooLarge`` (etcd's request limit
    is 1.5 MiB, and an indexed record's value is also copied into each index entry)."""
    request_timeout_s: float = 5.0
    cache_entries: int = 65_536
    """Records whose index entries the store remembers (:mod:`segtxn.metastore.cache`)."""
    max_attempts: int = 64
    """Retries of an unconditional write that keeps losing races before StoreUnavailable."""
    watch_retry_max_s: float = 2.0
    """Longest pause between attempts to re-establish a broken watch."""
