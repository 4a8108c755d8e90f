"""``segtxn produce`` and ``segtxn consume``: the client from a shell.

Both print a summary (how many, how fast, the last id); ``consume --print`` also prints each
message. ``-o json`` prints the summary (and the printed messages) as one JSON document.
Interrupted (Ctrl-C, or SIGINT even to a script's background job) or terminated (SIGTERM,
a supervisor's stop: :func:`segtxn.cli.errors.interruptible`), each says how far it got
before it exits with status 130 or 143; failed, each says how far it got and why in its one
error line, and exits with status 1.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from segtxn.cli.acks import Acks
from segtxn.cli.errors import FailedPartWay, ServiceUnreachable, interrupted
from segtxn.cli.output import OUTPUT, Format, show
from segtxn.cli.params import COUNT, POSITIVE_INT, SECONDS, Topic, refuse_unless
from segtxn.cli.service import URL, run
from segtxn.client import (
    Client,
    ClientError,
    Consumer,
    ErrorCategory,
    Message,
    MessageId,
    ServerError,
)
from segtxn.protocol.limits import DEFAULT_MAX_MESSAGE_BYTES
from segtxn.protocol.names import Domain, client_name_problem

MAX_GENERATED_BYTES = DEFAULT_MAX_MESSAGE_BYTES
"""The largest --size a broker takes: one above it passed here and every send then failed
with MessageTooLarge."""
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
@click.option(
    "--send-timeout",
    "send_timeout_s",
    default=30.0,
    show_default=True,
    type=SECONDS,
    help="Fail once a message is not stored this many seconds after it was sent.",
)
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
    send_timeout_s: float,
    output: str,
) -> None:
    """Send COUNT messages to TOPIC and report the rate.

    It stops at the first message that fails (exit status 1), saying how many were stored,
    how many the broker refused and how many were sent with an outcome unknown.
    """
    refuse_unless(ctx, "size", message is None, "-m gives the payload")
    _check_name("producer", name, "'--name'")
    sends = _Sends()

    def progress() -> str:
        said = f"{sends.stored:,} of {count:,} messages stored"
        if sends.refused:
            said += f"; {sends.refused:,} refused"
        if unknown := sends.made - sends.stored - sends.refused - sends.unsent:
            said += f"; {unknown:,} more sent, whether they were stored is unknown"
        if sends.unsent:
            said += f"; {sends.unsent:,} never sent (not stored)"
        return said

    async def body(client: Client) -> dict[str, Any]:
        producer = await client.create_producer(topic, name=name, send_timeout_s=send_timeout_s)
        started = time.perf_counter()
        # a bar for a person watching; not on a terminal (a pipe, a log) it printed a bare
        # "sending" there, which says nothing the summary does not
        hidden = not sys.stderr.isatty()
        with click.progressbar(
            length=count, label="sending", file=sys.stderr, hidden=hidden
        ) as bar:
            sends.on_stored = lambda: bar.update(1)
            # the bytes the shell passed, also those not UTF-8 (Python's lone surrogates)
            given = os.fsencode(message) if message is not None else None
            for i in range(count):
                if sends.failure is not None:  # stop at the first failure, not after every
                    raise sends.failure  # send timed out
                payload = given if given is not None else (b"%08d" % i).ljust(size, b".")
                key = f"key-{i % keys}" if keys else None
                sends.add(await producer.send_async(payload, key=key))
            last = await sends.all_settled()
        elapsed = time.perf_counter() - started
        await producer.close()
        return {
            "topic": topic,
            "sent": count,
            "seconds": round(elapsed, 3),
            "rate": round(count / elapsed),
            "lastId": str(last),
        }

    try:
        done = run(body, url)
    except KeyboardInterrupt:
        interrupted(progress())
    except Exception as e:
        if not sends.made:  # nothing done yet: the error alone says it
            raise
        raise FailedPartWay(progress()) from e  # every send is settled: the client closed
    show(
        output,
        done,
        f"sent {_messages(count)} in {done['seconds']:.2f}s ({done['rate']} msg/s); "
        f"last id {done['lastId']}",
    )


class _Sends:
    """``produce``'s sends, counted as they settle rather than kept: a list of every send's
    future (a million, for ``-n 1000000``) was walked by each full collection of the
    garbage collector, which came more often and took longer the more there were, so a
    long run slowed down as it went. The first failure is kept (each one's error is
    retrieved here, so none is logged again when the client closes)."""

    def __init__(self) -> None:
        self.made = self.settled = self.stored = self.refused = self.unsent = 0
        self.failure: BaseException | None = None
        self.on_stored: Callable[[], None] = lambda: None
        self._last: asyncio.Future[MessageId] | None = None
        self._closed = False
        self._all = asyncio.Event()

    def add(self, future: asyncio.Future[MessageId]) -> None:
        self.made += 1
        self._last = future
        future.add_done_callback(self._done)

    def _done(self, future: asyncio.Future[MessageId]) -> None:
        self.settled += 1
        if self._closed and self.settled == self.made:
            self._all.set()
        if future.cancelled():
            return
        error = future.exception()
        if error is None:
            self.stored += 1
            self.on_stored()
            return
        if isinstance(error, ServerError) and error.category is not ErrorCategory.OUTCOME_UNKNOWN:
            self.refused += 1  # the broker said no: not stored
        elif isinstance(error, ClientError) and error.retriable:
            self.unsent += 1  # never written (its broker could not be reached)
        if self.failure is None:
            self.failure = error

    async def all_settled(self) -> MessageId:
        """Wait until every send made is settled (each ends by its send timeout, or the
        client's close); the id of the last one.

        Raises:
            the first send's failure, if one failed.
        """
        self._closed = True
        if self.settled < self.made:
            await self._all.wait()
        if self.failure is not None:
            raise self.failure
        assert self._last is not None  # (count >= 1)
        return self._last.result()


def _check_name(kind: str, name: str | None, hint: str) -> None:
    """A name the broker would refuse is a usage error before anything connects (exit 2,
    as a malformed topic is), not a server's refusal once connected."""
    problem = None if name is None else client_name_problem(kind, name)
    if problem is not None:
        raise click.BadParameter(problem, param_hint=hint)


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
    type=click.Choice(["Exclusive", "Failover", "Shared"], case_sensitive=False),
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
    """Receive and acknowledge messages of TOPIC on SUBSCRIPTION; print how many.

    It receives on while up to 256 acknowledgments await their answers, and ends (or stops)
    once every one is answered; interrupted, it counts those without an answer yet as of
    unknown outcome.

    An acknowledgment that fails (the broker's store is briefly down, no answer came in
    time, the broker cannot be reached) does not stop it: the message may be delivered
    again, which an at-least-once consumer takes anyway. It warns once, counts them in its
    summary (those that got no answer as of unknown outcome: the broker may have applied
    them), and fails (exit status 1) only when acknowledgments keep failing for longer than
    the client's operation timeout (30 s). Idle for --idle-timeout while it cannot reach a
    broker (reconnecting) is a failure too (exit status 1): messages may remain.
    """
    if not subscription.strip():
        raise click.BadParameter("a subscription needs a name", param_hint="SUBSCRIPTION")
    _check_name("subscription", subscription, "SUBSCRIPTION")
    streaming = show_each and output == Format.TABLE  # a person watches them come
    acks: Acks | None = None
    """Made once subscribed (with the client's operation timeout as its outage limit)."""

    def progress() -> str:
        if acks is None:
            return "0 messages received and acknowledged"
        received, in_doubt = acks.received, acks.in_doubt
        if not acks.unacknowledged and not in_doubt:
            return f"{received:,} messages received and acknowledged"
        said = [_unacknowledged(acks.unacknowledged, acks.unknown)] if acks.unacknowledged else []
        if in_doubt == 1:
            said.append(
                "the last one's acknowledgment had no answer yet, its outcome unknown: "
                "it may be delivered again"
            )
        elif in_doubt:
            said.append(
                f"{in_doubt:,} acknowledgments had no answer yet, their outcome unknown: "
                "those messages may be delivered again"
            )
        return (
            f"{received:,} messages received, {acks.acknowledged:,} of them acknowledged "
            f"({'; '.join(said)})"
        )

    async def body(client: Client) -> dict[str, Any]:
        nonlocal acks
        consumer = await client.subscribe(
            topic, subscription, subscription_type=sub_type, initial_position=initial
        )
        acks = taken = Acks(client.timeouts.operation_timeout_s)
        keys: set[str] = set()
        shown: list[dict[str, Any]] = []
        first = last = None
        try:
            while not count or taken.received < count:
                await taken.room()  # (raises the acknowledgment failure that stops it)
                try:
                    message = await _next(consumer, taken, idle_timeout)
                except TimeoutError:
                    cut_off = consumer.reconnecting()
                    if cut_off:  # not idle: nothing could arrive, the backlog is unknown
                        raise ServiceUnreachable(
                            f"no message for {idle_timeout:g} s while it could not reach the "
                            f"broker of {', '.join(cut_off)} (reconnecting): messages may "
                            "remain"
                        ) from None
                    break
                # counted at once: a stop from here on (Ctrl-C while its acknowledgment waits
                # for an answer) must not leave out a message the broker may count as consumed
                taken.took()
                if streaming:
                    shown_value = message.value[:SHOWN_BYTES]
                    click.echo(f"{message.message_id} key={message.key} {shown_value!r}")
                elif show_each:
                    shown.append(_shown(message))
                taken.add(await consumer.acknowledge_async(message))
                first = first or str(message.message_id)
                last = str(message.message_id)
                if message.key is not None:
                    keys.add(message.key)
            await taken.settled()
        except Exception:
            # a failure says how far it got once every acknowledgment sent is answered (an
            # interrupt, a CancelledError, does not wait: those left are in doubt)
            await taken.drained()
            raise
        summary: dict[str, Any] = {
            "topic": topic,
            "subscription": subscription,
            "received": taken.received,
            "keys": len(keys),
            "firstId": first,
            "lastId": last,
            "unacknowledged": taken.unacknowledged,
            "ackOutcomeUnknown": taken.unknown,
        }
        if show_each and not streaming:
            summary["messages"] = shown
        return summary

    try:
        done = run(body, url)
    except KeyboardInterrupt:
        interrupted(progress())
    except Exception as e:
        if acks is None:  # nothing done yet: the error alone says it
            raise
        raise FailedPartWay(progress()) from e
    line = f"received {_messages(done['received'])}"
    if done["received"]:
        line += f" ({done['keys']} keys), first {done['firstId']}, last {done['lastId']}"
    if done["unacknowledged"]:
        line += f"; {_unacknowledged(done['unacknowledged'], done['ackOutcomeUnknown'])}"
    show(output, done, line)


async def _next(consumer: Consumer, acks: Acks, idle_timeout_s: float) -> Message:
    """The next message, within ``idle_timeout_s``; one already here without a task or a
    timer, else unless an acknowledgment's failure stops the command first (raised).

    Raises:
        TimeoutError: none came within ``idle_timeout_s``.
    """
    try:
        return await consumer.receive(timeout_s=0)
    except TimeoutError:
        return await acks.unless_stopped(consumer.receive(timeout_s=idle_timeout_s))


def _unacknowledged(count: int, unknown: int) -> str:
    """``count`` acknowledgments did not succeed, ``unknown`` of them with no answer."""
    said = []
    if failed := count - unknown:
        said.append(f"{failed:,} acknowledgment{'s' if failed > 1 else ''} failed")
    if unknown:
        said.append(
            f"{unknown:,} acknowledgment{'s' if unknown > 1 else ''} got no answer, "
            f"{'their' if unknown > 1 else 'its'} outcome unknown"
        )
    return f"{'; '.join(said)}: those messages may be delivered again"


def _messages(count: int) -> str:
    """``1 message``, ``3 messages``."""
    return f"{count} message" if count == 1 else f"{count} messages"
