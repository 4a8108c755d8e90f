"""02: a transaction writes to two topics at once: consumers see all of it, or none.

    python examples/02_transaction.py [URL]

The first transaction commits: both orders and their payments become visible together. The
second aborts (an exception inside the ``async with``): nothing of it is ever delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys

from segtxn.client import Client, TopicAlreadyExists

ORDERS = "topic://examples/shop/orders"
PAYMENTS = "topic://examples/shop/payments"


class OutOfStock(Exception):
    """The application's own reason to give a transaction up."""


async def main(url: str) -> None:
    async with Client(url) as client:
        for topic in (ORDERS, PAYMENTS):
            with contextlib.suppress(TopicAlreadyExists):  # made by an earlier run
                await client.admin.create_topic(topic)
        watcher = await client.subscribe(PAYMENTS, "ledger")
        orders = await client.create_producer(ORDERS)
        payments = await client.create_producer(PAYMENTS)

        async with client.transaction(timeout_s=60) as txn:  # commits when the block ends
            for order in ("order-1", "order-2"):
                await orders.send(b"placed", key=order, txn=txn)
                await payments.send(b"charged 10 EUR", key=order, txn=txn)
        print(f"committed {txn.id}: {await txn.status()}")

        try:
            async with client.transaction(timeout_s=60) as doomed:  # aborts on the exception
                await orders.send(b"placed", key="order-3", txn=doomed)
                await payments.send(b"charged 99 EUR", key="order-3", txn=doomed)
                raise OutOfStock("order-3")
        except OutOfStock:
            print(f"aborted {doomed.id}: {await doomed.status()}")

        seen: list[str] = []
        while True:  # only the committed payments arrive
            try:
                message = await watcher.receive(timeout_s=2)
            except TimeoutError:
                break
            seen.append(str(message.key))
            await watcher.acknowledge(message)
        print(f"payments delivered: {', '.join(seen)}")  # order-1, order-2


if __name__ == "__main__":
    asyncio.run(
        main(
            sys.argv[1]
            if len(sys.argv) > 1
            else os.environ.get("SEGTXN_URL", "http://127.0.0.1:8080")
        )
    )
