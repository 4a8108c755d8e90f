"""01: send messages with keys, then receive and acknowledge them.

Run against any segtxn cluster (``segtxn standalone`` on your machine will do)::

    python examples/01_produce_consume.py [URL]      # URL: SEGTXN_URL, else :8080

A consumer gets each key's messages in the order they were sent; an acknowledged message is
never delivered to the subscription again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys

from segtxn.client import Client, TopicAlreadyExists

TOPIC = "topic://examples/basics/greetings"


async def main(url: str) -> None:
    async with Client(url) as client:
        with contextlib.suppress(TopicAlreadyExists):  # made by an earlier run
            await client.admin.create_topic(TOPIC, segments=2)

        # Subscribe first: a new subscription starts at the end ("latest") by default.
        consumer = await client.subscribe(TOPIC, "greeter")
        producer = await client.create_producer(TOPIC)
        for i in range(6):
            key = f"customer-{i % 2}"
            message_id = await producer.send(f"hello {i}".encode(), key=key)
            print(f"sent     {key} hello {i} as {message_id}")  # stored durably already

        for _ in range(6):
            message = await consumer.receive(timeout_s=10)
            print(f"received {message.key} {message.value.decode()}")
            await consumer.acknowledge(message)


if __name__ == "__main__":
    asyncio.run(
        main(
            sys.argv[1]
            if len(sys.argv) > 1
            else os.environ.get("SEGTXN_URL", "http://127.0.0.1:8080")
        )
    )
