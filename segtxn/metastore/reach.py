"""Reaching a store at start-up: bounded retries, then one clear error.

A server that cannot reach its metadata store can do nothing useful, and one that waits for
it in silence looks, in a pod's log, like one that hangs (issue 15: a broker on a dead etcd
port printed nothing for eleven minutes). Servers call :func:`wait_reachable` before their
first real request: it asks the store for its revision (a read of nothing) until it answers,
retrying with back-off, and gives up after ``timeout_s`` with :class:`StoreUnavailable`
saying how long it tried and the last reason. The store stays open either way; its owner closes it.
"""

from __future__ import annotations

import asyncio
import logging

from segtxn.metastore.errors import MetadataStoreError, StoreAccessDenied, StoreUnavailable
from segtxn.metastore.store import MetadataStore

log = logging.getLogger(__name__)

FIRST_RETRY_S = 0.1
LONGEST_RETRY_S = 2.0


async def wait_reachable(store: MetadataStore, *, timeout_s: float, url: str) -> int:
    """Wait until ``store`` answers a read; return its current revision.

    Args:
        store: an open store (not closed here).
        timeout_s: give up this long after the first attempt (0: one attempt, bounded by the
            store's own request timeout).
        url: the store's URL, for the messages.

    Raises:
        StoreUnavailable: no answer within ``timeout_s``; the message says how long it
            tried and the last failure (callers name the store).
        MetadataStoreError: any other failure of the read (not retried: it cannot pass).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    delay = FIRST_RETRY_S
    attempts = 0
    last = ""
    while True:
        attempts += 1
        bound = max(deadline - loop.time(), 0.001) if timeout_s > 0 else None
        try:
            async with asyncio.timeout(bound):
                return await store.revision()
        except StoreUnavailable as e:
            last = str(e)
        except TimeoutError:  # cut short by the deadline: the reason before it says more
            last = last or "no answer"
        left = deadline - loop.time()
        if left <= 0:
            raise StoreUnavailable(
                f"not reachable within {timeout_s:g} s "
                f"({attempts} attempt{'s' if attempts > 1 else ''}; last: {last})"
            )
        log.info("metadata store %s: not reachable yet (%s); %.1f s left", url, last, left)
        await asyncio.sleep(min(delay, left))  # a retry's back-off, bounded by the deadline
        delay = min(delay * 2, LONGEST_RETRY_S)


ACCESS_RECHECK_S = 1.0
"""How long :func:`access_denied` waits for its one read."""


async def access_denied(store: MetadataStore) -> StoreAccessDenied | None:
    """The refusal of the server's store credentials in force, or None while access works
    (``/readyz`` asks it). While access is denied, one read (of the store's revision,
    which needs read permission on the key prefix) checks whether it is back first: a
    server kept out of its Service by a failing readiness probe gets no other traffic
    that would find out. No store I/O while access works."""
    if store.engine.denied is None:
        return None
    try:
        async with asyncio.timeout(ACCESS_RECHECK_S):
            await store.revision()
    except (MetadataStoreError, TimeoutError):
        pass
    return store.engine.denied
