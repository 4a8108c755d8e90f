"""``segtxn produce`` and ``segtxn consume``: the client from a shell.

Both print a summary (how many, how fast, the last id); ``consume --print`` also prints each
message. ``-o json`` prints the summary (and the printed messages) as one JSON document.
Interrupted (Ctrl-C), each says how far it got before it exits with status 130.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import click

from segtxn.cli.errors import INTERRUPTED, fail
from segtxn.cli.output import OUTPUT, Format, show
from segtxn.cli.params import COUNT, POSITIVE_INT, SECONDS, Topic, refuse_unless
from segtxn.cli.service import URL, run
from segtxn.client import Client, Message, MessageId
from segtxn.protocol.names import Domain

MAX_GENERATED_BYTES = 5 * 1024 * 1024
SHOWN_BYTES = 80
"""How much of a payload ``consume --print`` shows (as a Python bytes literal)."""


@click.command()
@URL
@click.argument("topic", type=Topic(Domain.TOPIC, Domain.PERSISTENT))
@click.option(
    "-n", "--count", default=1, show_default=True, type=POSITIVE_INT, help="Messages to send."
)
@click.option(
    "-m", "--message", default=None, help="Payload of every message (default: generated)."
)
@click.option(
    "--size",
    default=100,
    show_default=True,
    type=click.IntRange(8, MAX_GENERATED_BYTES),
    help="Generated payload bytes (not with -m).",
)
@click.option(
    "--keys", default=0, type=COUNT, help="Use this many distinct keys (default 0: no key)."
)
@click.option("--name", default=None, help="Producer name (reuse it to keep de-duplication).")
@OUTPUT
@click.pass_context
def produce(
    ctx: click.Context,
    *,
    url: str,
    topic: str,
    count: int,
    message: str | None,
    size: int,
    keys: int,
    name: str | None,
    output: str,
) -> None:
    """Send COUNT messages to TOPIC and report the rate."""
    refuse_unless(ctx, "size", message is None, "-m gives the payload")
    sent = stored = 0

    async def body(client: Client) -> dict[str, Any]:
        nonlocal sent, stored
        producer = await client.create_producer(topic, name=name)
        started = time.perf_counter()
        futures = []
        failed: list[BaseException] = []
        with click.progressbar(length=count, label="sending", file=sys.stderr) as bar:

            def settled(future: asyncio.Future[MessageId]) -> None:
                """Count a stored message; keep the first failure (each one's error is
                retrieved here, so none is logged again when the client closes)."""
                if future.cancelled():
                    return
                nonlocal stored
                error = future.exception()
                if error is None:
                    stored += 1
                    bar.update(1)
                elif not failed:
                    failed.append(error)

            for i in range(count):
                if failed:  # stop at the first failure, not after every send timed out
                    raise failed[0]
                payload = (
                    message.encode() if message is not None else (b"%08d" % i).ljust(size, b".")
                )
                key = f"key-{i % keys}" if keys else None
                future = await producer.send_async(payload, key=key)
                sent += 1
                future.add_done_callback(settled)
                futures.append(future)
            ids = await asyncio.gather(*futures)
        elapsed = time.perf_counter() - started
        await producer.close()
        return {
            "topic": topic,
            "sent": count,
            "seconds": round(elapsed, 3),
            "rate": round(count / elapsed),
            "lastId": str(ids[-1]),
        }

    try:
        done = run(body, url)
    except KeyboardInterrupt:
        unknown = f"; {sent - stored:,} more sent, whether they were stored is unknown"
        fail(
            f"interrupted: {stored:,} of {count:,} messages stored"
            + (unknown if sent > stored else ""),
            INTERRUPTED,
        )
    show(
        output,
        done,
        f"sent {count} messages in {done['seconds']:.2f}s ({done['rate']} msg/s); "
        f"last id {done['lastId']}",
    )


def _shown(message: Message) -> dict[str, Any]:
    return {
        "id": str(message.message_id),
        "key": message.key,
        "value": message.value[:SHOWN_BYTES].decode("utf-8", "backslashreplace"),
        "bytes": len(message.value),
    }


@click.command()
@URL
@click.argument("topic", type=Topic())
@click.argument("subscription")
@click.option("-n", "--count", default=0, type=COUNT, help="Stop after this many (0: until idle).")
@click.option(
    "--type",
    "sub_type",
    default="Exclusive",
    show_default=True,
    type=click.Choice(["Exclusive", "Failover", "Shared"]),
)
@click.option(
    "--initial", default="earliest", show_default=True, type=click.Choice(["earliest", "latest"])
)
@click.option(
    "--idle-timeout", default=5.0, show_default=True, type=SECONDS, help="Stop after idle seconds."
)
@click.option(
    "--print/--no-print",
    "show_each",
    default=False,
    show_default=True,
    help="Also print each message (its id, key and first 80 bytes).",
)
@OUTPUT
def consume(
    *,
    url: str,
    topic: str,
    subscription: str,
    count: int,
    sub_type: str,
    initial: str,
    idle_timeout: float,
    show_each: bool,
    output: str,
) -> None:
    """Receive and acknowledge messages of TOPIC on SUBSCRIPTION; print how many."""
    if not subscription.strip():
        raise click.BadParameter("a subscription needs a name", param_hint="SUBSCRIPTION")
    streaming = show_each and output == Format.TABLE  # a person watches them come
    received = 0

    async def body(client: Client) -> dict[str, Any]:
        nonlocal received
        consumer = await client.subscribe(
            topic, subscription, subscription_type=sub_type, initial_position=initial
        )
        keys: set[str] = set()
        shown: list[dict[str, Any]] = []
        first = last = None
        while not count or received < count:
            try:
                message = await consumer.receive(timeout_s=idle_timeout)
            except TimeoutError:
                break
            if streaming:
                shown_value = message.value[:SHOWN_BYTES]
                click.echo(f"{message.message_id} key={message.key} {shown_value!r}")
            elif show_each:
                shown.append(_shown(message))
            await consumer.acknowledge(message)
            received += 1
            first = first or str(message.message_id)
            last = str(message.message_id)
            if message.key is not None:
                keys.add(message.key)
        summary: dict[str, Any] = {
            "topic": topic,
            "subscription": subscription,
            "received": received,
            "keys": len(keys),
            "firstId": first,
            "lastId": last,
        }
        if show_each and not streaming:
            summary["messages"] = shown
        return summary

    try:
        done = run(body, url)
    except KeyboardInterrupt:
        fail(f"interrupted: {received:,} messages received and acknowledged", INTERRUPTED)
    line = f"received {done['received']} messages"
    if done["received"]:
        line += f" ({done['keys']} keys), first {done['firstId']}, last {done['lastId']}"
    show(output, done, line)
