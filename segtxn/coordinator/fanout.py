"""A v4 coordinator's decision, fanned out to its participants (PIP-31's second phase).

Each partition of a v4 transaction gets ``END_TXN_ON_PARTITION`` (its home broker writes
the commit or abort marker) and each subscription ``END_TXN_ON_SUBSCRIPTION`` (its broker
applies or drops the pending acknowledgments), all in parallel. A call is retried, with a
growing pause and the topic's home looked up again, while the participant's broker is
unreachable or answers ``ServiceNotReady`` or ``NotOwner`` (:data:`AWAY`), for
``timeout_s``; then it fails with ``ServiceNotReady``, the transaction COMMITTING /
ABORTING in the coordinator's log, which goes on finishing it in the background.
A participant whose topic (or subscription) does not exist has taken the decision: it was
deleted after it joined, with everything the transaction wrote or acknowledged there, so
there is nothing left to commit or abort (otherwise the transaction stayed COMMITTING for
good). Any other refusal (a terminated topic, a ``PersistenceError``) fails at once: the
client's END_TXN gets it; the coordinator tries the decision again in the background
unless the refusal is one of :data:`FINAL_REFUSALS` (logged at WARNING here; another
refusal, and a participant not taking the call in ``timeout_s``, at DEBUG: the loop that
tries again says them, sparingly). Calls are idempotent at the broker: running a fan-out
twice is safe.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import quote

import aiohttp

from segtxn.metastore import MetadataStoreError
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.names import TopicName
from segtxn.protocol.txn import TxnAction, TxnId
from segtxn.topics.catalog import Catalog

log = logging.getLogger(__name__)

PARTICIPANT_TIMEOUT = aiohttp.ClientTimeout(total=10)
GONE = (ErrorName.TOPIC_NOT_FOUND,)
"""A participant's answer that says its topic no longer exists (a deleted subscription is
answered with success: nothing is pending there)."""
FINAL_REFUSALS = (
    ErrorName.TOPIC_TERMINATED,
    ErrorName.INVALID_TXN_STATUS,
    ErrorName.NOT_ALLOWED,
    ErrorName.INVALID_ARGUMENT,
    ErrorName.INVALID_TOPIC_NAME,
)
"""A participant's refusals that no try can change: its topic is terminated (it cannot
take a marker), the transaction already ended the other way there (its broker's v4 checks
aborted it past its deadline), or the participant can never take the call (a topic without
v4 markers, an id, action or name it does not take). Any other refusal is the broker's own
trouble (``PersistenceError``: a cursor save refused until its record is repaired, a
ledger file damaged; a store away; a bug), which may pass."""
AWAY = (ErrorName.SERVICE_NOT_READY, ErrorName.NOT_OWNER)
"""A participant's answers that say the call goes through later, or elsewhere: its broker
is not ready (starting, its topic loading or moving), or does not serve the topic
(``NotOwner``: it moved, and the home the fan-out looked up was read before). Each is
tried again, with a new look-up, until ``timeout_s``. (A broker's ``NotOwner`` is a 307
naming the serving broker, which aiohttp follows by itself; one reaches the fan-out only
without a ``Location``. It was a refusal, which the coordinator answered the client's
END_TXN with: a 307 with nowhere to go, which the client took for a success.)"""
FIRST_RETRY_S = 0.05


class Participants:
    """The brokers a v4 decision goes to, found through the catalog."""

    def __init__(self, catalog: Catalog, http: aiohttp.ClientSession, timeout_s: float) -> None:
        self._catalog = catalog
        self._http = http
        self.timeout_s = timeout_s

    async def end(
        self,
        txn: TxnId,
        partitions: list[str],
        subscriptions: list[tuple[str, str]],
        action: TxnAction,
    ) -> None:
        """Tell every participant; returns once all took it.

        Raises:
            ServerError: a participant refused it, or did not take it within
                ``timeout_s`` (``ServiceNotReady``).
        """
        query = f"?action={action.value}"
        calls = [(p, f"/txn/{txn}/end{query}") for p in partitions] + [
            (t, f"/subscription/{quote(s, safe='')}/txn/{txn}/end{query}") for t, s in subscriptions
        ]
        await asyncio.gather(*(self.call(txn, action, topic, path) for topic, path in calls))

    async def call(self, txn: TxnId, action: TxnAction, topic: str, path: str) -> None:
        """One participant call, retried while its broker is away (see the module doc)."""
        name = TopicName.parse(topic)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        delay = FIRST_RETRY_S
        while True:
            problem: str
            try:
                url = await self._broker_of(name)
                if url is None:
                    log.info("txn %s: participant %s is gone; nothing to %s", txn, topic, action)
                    return
                async with self._http.post(
                    f"{url}/admin/v2/{name.path}{path}", timeout=PARTICIPANT_TIMEOUT
                ) as response:
                    if response.status < 300:
                        return
                    body = await _error_body(response)
                    if body is None:  # no broker's answer (a proxy's page): away, try again
                        problem = f"HTTP {response.status} without an error of a broker"
                    else:
                        error = ErrorName.parse(str(body.get("error", ErrorName.UNKNOWN.value)))
                        if error in GONE:
                            log.info("txn %s: participant %s is gone (%s); nothing to %s",
                                     txn, topic, body.get("message", ""), action)  # fmt: skip
                            return
                        if error not in AWAY:
                            log.log(  # (one that may pass: the caller's Retry says it)
                                logging.WARNING if error in FINAL_REFUSALS else logging.DEBUG,
                                "txn %s: %s refused by participant %s (%s): %s",
                                txn, action, topic, error, body.get("message", ""),
                            )  # fmt: skip
                            raise ServerError(error, str(body.get("message", "")))
                        problem = f"{error}: {body.get('message', '')}"
            except (aiohttp.ClientError, TimeoutError, MetadataStoreError) as e:
                problem = repr(e)
            except ServerError as e:  # (a refusal, above: raised)
                if e.name is not ErrorName.SERVICE_NOT_READY:
                    raise
                problem = e.message  # no live home broker (yet): away, as one that is down
            if loop.time() > deadline:
                log.debug(  # (the caller's Retry says it, sparingly)
                    "txn %s: participant %s did not take the %s in %g s: %s",
                    txn, topic, action, self.timeout_s, problem,
                )  # fmt: skip
                raise ServerError(
                    ErrorName.SERVICE_NOT_READY, f"{topic} did not take the decision: {problem}"
                )
            if delay == FIRST_RETRY_S:
                log.info("txn %s: participant %s unreachable (%s); retrying", txn, topic, problem)
            await asyncio.sleep(delay)  # the participant's broker is down: back off, retry
            delay = min(delay * 2, 1.0)

    async def _broker_of(self, name: TopicName) -> str | None:
        """The URL of ``name``'s home broker; None when the topic does not exist.

        Raises:
            ServerError(ServiceNotReady): it exists, and its home broker is not live.
            MetadataStoreError
        """
        broker = await self._catalog.home_of(name)
        url = None if broker is None else await self._catalog.broker_url(broker)
        if url is None:
            if await self._catalog.get(name) is None:
                return None
            raise ServerError(ErrorName.SERVICE_NOT_READY, f"{name} has no live home broker")
        return url


async def _error_body(response: aiohttp.ClientResponse) -> dict[str, Any] | None:
    """A broker's JSON error (``{"error", "message"}``), or None for anything else."""
    try:
        body = await response.json(content_type=None)
    except ValueError:  # (JSONDecodeError)
        return None
    return body if isinstance(body, dict) else None
