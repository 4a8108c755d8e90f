"""04: a topic's segment splits while a transaction writes to it; the transaction commits
and nothing is lost or reordered.

    python examples/04_split_during_transaction.py [URL]

A scalable topic (``topic://``) spreads keys over range segments by key hash. Splitting a
segment seals it and opens two that share its range; the producer follows the new layout by
itself, and a consumer reads the sealed segment to its end before its children, so each
key's messages arrive in the order they were sent, across the split.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys

from segtxn.client import Client, TopicAlreadyExists

TOPIC = "topic://examples/scaling/clicks"
KEYS = [f"user-{k}" for k in range(4)]


async def main(url: str) -> None:
    async with Client(url) as client:
        with contextlib.suppress(TopicAlreadyExists):  # made by an earlier run
            await client.admin.create_topic(TOPIC, segments=1)
        consumer = await client.subscribe(TOPIC, "counter", initial_position="latest")
        producer = await client.create_producer(TOPIC)
        active = [
            s["id"] for s in (await client.admin.stats(TOPIC))["segments"] if s["state"] == "ACTIVE"
        ]

        async with client.transaction(timeout_s=60) as txn:
            for n in range(3):
                for key in KEYS:
                    await producer.send(f"{key} click {n}".encode(), key=key, txn=txn)
            dag = await client.admin.split(TOPIC, active[0])  # while txn is open
            now = sorted(s["id"] for s in dag["segments"] if s["state"] == "ACTIVE")
            print(f"split segment {active[0]} during {txn.id}: active segments now {now}")
            for n in range(3, 6):
                for key in KEYS:
                    await producer.send(f"{key} click {n}".encode(), key=key, txn=txn)
        print(f"committed {txn.id}")

        clicks: dict[str, list[int]] = {key: [] for key in KEYS}
        for _ in range(6 * len(KEYS)):
            message = await consumer.receive(timeout_s=10)
            clicks[str(message.key)].append(int(message.value.split()[-1]))
            await consumer.acknowledge(message)
        for key, seen in clicks.items():
            print(f"{key}: clicks {seen}")  # 0..5, in order, each once


if __name__ == "__main__":
    asyncio.run(
        main(
            sys.argv[1]
            if len(sys.argv) > 1
            else os.environ.get("SEGTXN_URL", "http://127.0.0.1:8080")
        )
    )
