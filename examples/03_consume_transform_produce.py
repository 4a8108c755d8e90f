"""03: consume-transform-produce, exactly once: each input is acknowledged in the same
transaction that writes its output.

    python examples/03_consume_transform_produce.py [URL]

If the processor dies half-way, its open transaction aborts: the outputs it wrote are never
delivered and the inputs it acknowledged come back, so a restarted processor writes each
output once. Here it runs to the end: 10 words in, 10 shouted words out, in batches of 4.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys

from segtxn.client import (
    Client,
    Consumer,
    Message,
    Producer,
    ScalableProducer,
    TopicAlreadyExists,
)

WORDS = "topic://examples/pipeline/words"
SHOUTED = "topic://examples/pipeline/shouted"
BATCH = 4
WORDS_IN = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "again"]


async def batch_of(consumer: Consumer, most: int) -> list[Message]:
    """Up to ``most`` messages, fewer if none comes within a second."""
    batch: list[Message] = []
    while len(batch) < most:
        try:
            batch.append(await consumer.receive(timeout_s=1))
        except TimeoutError:
            break
    return batch


async def process(client: Client, consumer: Consumer, producer: Producer | ScalableProducer) -> int:
    """Shout every word there is; returns how many."""
    done = 0
    while batch := await batch_of(consumer, BATCH):
        async with client.transaction(timeout_s=30) as txn:
            for message in batch:  # queued, not awaited one by one: the commit waits for them
                await producer.send_async(message.value.upper(), key=message.key, txn=txn)
                await consumer.acknowledge_async(message, txn=txn)
        done += len(batch)
        print(f"transaction {txn.id}: {len(batch)} in, {len(batch)} out, committed")
    return done


async def main(url: str) -> None:
    async with Client(url) as client:
        for topic in (WORDS, SHOUTED):
            with contextlib.suppress(TopicAlreadyExists):  # made by an earlier run
                await client.admin.create_topic(topic)
        inputs = await client.subscribe(WORDS, "shouter", initial_position="latest")
        outputs = await client.subscribe(SHOUTED, "reader", initial_position="latest")
        feeder = await client.create_producer(WORDS)
        for i, word in enumerate(WORDS_IN):
            await feeder.send(word.encode(), key=f"word-{i}")

        shouter = await client.create_producer(SHOUTED)
        print(f"processed {await process(client, inputs, shouter)} words")

        out = []
        for message in await batch_of(outputs, 100):
            out.append(message.value.decode())
            await outputs.acknowledge(message)  # so that a next run reads its own outputs
        print(f"{len(out)} outputs: {' '.join(out)}")


if __name__ == "__main__":
    asyncio.run(
        main(
            sys.argv[1]
            if len(sys.argv) > 1
            else os.environ.get("SEGTXN_URL", "http://127.0.0.1:8080")
        )
    )
