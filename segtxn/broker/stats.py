"""What ``GET .../stats`` answers for one topic or segment: loaded here, or sealed and not.

A loaded topic answers from memory (:func:`loaded_stats`): its counters, producers,
consumers, cursors. A sealed segment that is not loaded answers from its records in the
metadata store (:func:`sealed_stats`, through :func:`segtxn.ledger.sealed.read_sealed`)
without being loaded: a scalable topic's stats asks every segment it ever had, and loading
each sealed one to answer kept them all loaded — their files open, their state in memory
— for as long as anyone polled (issue 22). Both answers have the same shape; ``loaded``
tells them apart, and the counters of a segment not loaded are 0 (they count since load).
"""

from __future__ import annotations

from segtxn.broker.topic import Topic
from segtxn.ledger.cursor import ManagedCursor
from segtxn.ledger.sealed import SealedLedger
from segtxn.protocol.names import TopicName


def _subscription(
    cursor: ManagedCursor | None, type_: str | None, consumers: int, out: int
) -> dict[str, object]:
    return {
        "type": type_,
        "consumers": consumers,
        "backlog": cursor.backlog() if cursor else 0,
        "msgOutCounter": out,
        "markDeletePosition": str(cursor.mark_delete) if cursor else None,
    }


def loaded_stats(topic: Topic) -> dict[str, object]:
    """The stats of a topic loaded on this broker."""
    subs: dict[str, object] = {}
    for name in topic.subscription_names():
        live = topic.subscriptions.get(name)
        sub = _subscription(
            topic.ledger.cursors.get(name),
            str(live.type) if live and live.type else None,
            len(live.consumers) if live else 0,
            live.messages_out if live else 0,
        )
        if live is not None and live.failed is not None:  # its ledger cannot be read on
            sub["deliveryError"] = live.failed.message
        subs[name] = sub
    last = topic.ledger.last_confirmed
    return {
        "topic": str(topic.name),
        "loaded": True,
        "msgInCounter": topic.counters.messages_in,
        "bytesInCounter": topic.counters.bytes_in,
        # over every subscription (redeliveries included): what autoscale's rates read
        "msgOutCounter": sum(s.messages_out for s in topic.subscriptions.values()),
        "bytesOutCounter": sum(s.bytes_out for s in topic.subscriptions.values()),
        "duplicatesDropped": topic.counters.duplicates,
        "producers": len(topic.producers),
        "lastConfirmedPosition": None if last is None else str(last),
        "sealed": topic.ledger.is_sealed,
        "storage": {
            "entriesWritten": topic.ledger.stats.entries,
            "batches": topic.ledger.stats.batches,
            "ledgerRollovers": topic.ledger.stats.rollovers,
        },
        "subscriptions": subs,
    }


def sealed_stats(name: TopicName, ledger: SealedLedger) -> dict[str, object]:
    """The stats of a sealed segment not loaded here, from its records: no producer or
    consumer is connected to it, and its counters are 0."""
    last = ledger.last_confirmed
    return {
        "topic": str(name),
        "loaded": False,
        "msgInCounter": 0,
        "bytesInCounter": 0,
        "msgOutCounter": 0,
        "bytesOutCounter": 0,
        "duplicatesDropped": 0,
        "producers": 0,
        "lastConfirmedPosition": None if last is None else str(last),
        "sealed": True,
        "storage": {"entriesWritten": 0, "batches": 0, "ledgerRollovers": 0},
        "subscriptions": {
            sub: _subscription(cursor, None, 0, 0) for sub, cursor in sorted(ledger.cursors.items())
        },
    }


def retired_stats(name: TopicName) -> dict[str, object]:
    """The stats of a RETIRED segment whose records are deleted already: nothing left,
    ``retired`` true (segtxn/broker/retire.py)."""
    return {
        "topic": str(name),
        "loaded": False,
        "retired": True,
        "msgInCounter": 0,
        "bytesInCounter": 0,
        "msgOutCounter": 0,
        "bytesOutCounter": 0,
        "duplicatesDropped": 0,
        "producers": 0,
        "lastConfirmedPosition": None,
        "sealed": True,
        "storage": {"entriesWritten": 0, "batches": 0, "ledgerRollovers": 0},
        "subscriptions": {},
    }
