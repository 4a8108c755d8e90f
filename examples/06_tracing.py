"""06: follow one transaction across the client, the coordinator and the broker (tracing).

    segtxn standalone --trace                      # in one terminal: the servers' spans
    python examples/06_tracing.py [URL]            # in another: the client's

Tracing reads the standard ``OTEL_*`` variables (``OTEL_TRACES_EXPORTER=otlp`` and
``OTEL_EXPORTER_OTLP_ENDPOINT`` send to a collector); without any, this program prints its
spans on stdout, one JSON object per line. It prints ``trace <id>``: the servers' spans of
this transaction (NEW_TXN, each send, the ack, END_TXN) carry the same trace id, and each
segment's ``materialize`` span links to it (docs/tracing.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys

from segtxn import tracing
from segtxn.client import Client, TopicAlreadyExists

ORDERS = "topic://examples/traced/orders"
INVOICES = "topic://examples/traced/invoices"


async def main(url: str) -> None:
    async with Client(url) as client:
        for topic in (ORDERS, INVOICES):
            with contextlib.suppress(TopicAlreadyExists):  # made by an earlier run
                await client.admin.create_topic(topic, segments=2)
        orders = await client.subscribe(ORDERS, "billing", initial_position="earliest")
        await (await client.create_producer(ORDERS)).send(b"2 books", key="order-7")
        order = await orders.receive(timeout_s=10)
        invoices = await client.create_producer(INVOICES)

        async with client.transaction(timeout_s=60) as txn:
            await invoices.send(b"invoice: " + order.value, key=order.key, txn=txn)
            await invoices.send(b"receipt: " + order.value, key="receipts", txn=txn)
            await orders.acknowledge(order, txn=txn)
            assert txn.span is not None  # tracing is on: the transaction is a span
            trace_id = txn.span.get_span_context().trace_id
        print(f"trace {trace_id:032x}")
        print(f"committed {txn.id}: {await txn.status()}")


if __name__ == "__main__":
    # the OTEL_* variables, or else spans on stdout
    tracing.configure("segtxn-example") or tracing.configure("segtxn-example", exporter="console")
    asyncio.run(
        main(
            sys.argv[1]
            if len(sys.argv) > 1
            else os.environ.get("SEGTXN_URL", "http://127.0.0.1:8080")
        )
    )
    tracing.flush()  # the spans of the last moments, before the program ends
