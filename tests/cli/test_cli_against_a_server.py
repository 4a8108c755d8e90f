"""The command line against a real ``segtxn standalone`` process (issue 15, item 5): a
server's refusal, an interrupted produce or consume, a failed send, unreachable service URLs
are each one line on stderr with a non-zero exit and no traceback, saying how far the
command got. The argument errors are in test_cli_errors.py."""

from __future__ import annotations

import asyncio
import gc
import logging
import re
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from click.testing import Result

from segtxn.cli import service
from segtxn.cli.errors import describe
from segtxn.client import Client, ErrorName, MessageId, ServerError
from segtxn.client.producer import Producer
from segtxn.client.producer_options import ProducerOptions
from segtxn.metastore.etcd_server import free_port
from tests.cli.test_cli_errors import invoke, one_line
from tests.waiting import wait_until


def test_server_errors_are_one_line(standalone: str) -> None:
    missing = invoke("topics", "stats", "topic://t/ns/missing", "--url", standalone)
    assert missing.exit_code == 1
    assert one_line(missing) == "Error: TopicNotFound: topic topic://t/ns/missing does not exist"
    created = invoke(
        "topics", "create", "topic://t/ns/split", "--segments", "2", "--url", standalone
    )
    assert created.exit_code == 0, created.output
    outside = invoke(
        "topics", "split", "topic://t/ns/split", "0", "--at", "0x9000", "--url", standalone
    )
    assert outside.exit_code == 1
    assert "InvalidArgument" in one_line(outside) and "split point 0x9000" in one_line(outside)


def test_deleting_a_topic_in_use_names_the_flag_that_forces_it(standalone: str) -> None:
    topic = "topic://t/ns/in-use"
    assert invoke("topics", "create", topic, "--url", standalone).exit_code == 0

    async def delete_while_consumed() -> tuple[Result, Result]:
        async with Client(standalone) as client:
            consumer = await client.subscribe(topic, "busy")
            refused = await asyncio.to_thread(
                invoke, "topics", "delete", topic, "--url", standalone
            )
            forced = await asyncio.to_thread(
                invoke, "topics", "delete", topic, "--force", "--url", standalone
            )
            await consumer.close()
            return refused, forced

    refused, forced = asyncio.run(delete_while_consumed())
    assert refused.exit_code == 1
    assert one_line(refused) == (
        f"Error: {topic} has connected clients; --force deletes it anyway, disconnecting them"
    )
    assert forced.exit_code == 0, forced.output
    assert invoke("topics", "stats", topic, "--url", standalone).exit_code == 1  # gone


def test_brokers_homes_and_a_drain_without_replication(standalone: str) -> None:
    invoke("topics", "create", "persistent://t/ns/held", "--url", standalone)
    held = invoke("brokers", "homes", "standalone", "--url", standalone)
    assert held.exit_code == 0 and "persistent://t/ns/held" in held.stdout.splitlines()
    typo = invoke("brokers", "homes", "standalnoe", "--url", standalone)
    assert typo.exit_code == 0 and typo.stderr.strip() == (
        "standalnoe holds no topic or segment, and no broker standalnoe is registered now "
        "(is the id right?)"
    )
    refused = invoke("brokers", "drain", "standalone", "--url", standalone)
    assert refused.exit_code == 1
    assert one_line(refused) == (
        "Error: NotAllowed: broker standalone keeps its ledgers on its own disk (no "
        "--replication): its topics cannot move to another broker"
    )
    unknown = invoke("brokers", "drain", "nobody", "--url", standalone)
    assert unknown.exit_code == 1
    assert one_line(unknown) == (  # at once: a typo, not a broker about to come
        "Error: InvalidArgument: no broker nobody is registered (registered: standalone)"
    )
    gone = invoke("brokers", "undrain", "nobody", "--url", standalone)
    assert gone.exit_code == 1
    assert one_line(gone) == (
        "Error: InvalidArgument: no broker nobody is registered (registered: standalone): "
        "not registered now, so there is no drain of it to stop here (a broker that is gone "
        "starts undrained; one still running that lost its registration registers again "
        "still draining: undrain it once it is back)"
    )


def test_produce_reports_what_it_sent(standalone: str) -> None:
    invoke("topics", "create", "topic://t/ns/rate", "--url", standalone)
    result = invoke("produce", "topic://t/ns/rate", "-n", "5", "--keys", "2", "--url", standalone)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("sent 5 messages in ")
    # not on a terminal (the runner's stderr, a pipe, a log), the progress bar is left out:
    # it printed a bare "sending", which told a script's log nothing
    assert result.stderr == "", result.stderr


def test_one_message_is_counted_in_the_singular_and_a_type_in_any_case(
    standalone: str,
) -> None:
    topic = "topic://t/ns/one"
    invoke("topics", "create", topic, "--url", standalone)
    sent = invoke("produce", topic, "-m", "only", "--url", standalone)
    assert sent.exit_code == 0, sent.output
    assert sent.stdout.startswith("sent 1 message in "), sent.stdout
    got = invoke("consume", topic, "one", "--type", "shared", "-n", "1", "--url", standalone)
    assert got.exit_code == 0, got.output
    assert got.stdout.startswith("received 1 message ("), got.stdout


def test_produce_sends_the_bytes_of_a_message_that_is_not_utf8(standalone: str) -> None:
    """``-m`` sends the bytes the shell passed, as ``-m "$(printf '\\xff')"`` does: Python
    hands them over as lone surrogates, which ``str.encode()`` refused (before: "internal
    error: UnicodeEncodeError")."""
    topic = "topic://t/ns/bytes"
    invoke("topics", "create", topic, "--url", standalone)
    sent = invoke("produce", topic, "-m", "caf\udce9 \udcff", "--url", standalone)
    assert sent.exit_code == 0, sent.output

    async def received() -> bytes:
        async with Client(standalone) as client:
            consumer = await client.subscribe(topic, "raw", initial_position="earliest")
            return (await consumer.receive(timeout_s=10)).value

    assert asyncio.run(received()) == b"caf\xe9 \xff"


def _segtxn(*args: str, sigint_ignored: bool = False) -> subprocess.Popen[str]:
    """A ``segtxn`` process; ``sigint_ignored``: started with SIGINT ignored, as a shell
    script's background job is (``segtxn produce ... &``: POSIX, without job control)."""
    command = [sys.executable, "-m", "segtxn.cli", *args]
    if sigint_ignored:  # an ignored signal stays ignored across exec
        command = ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *command]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


INTERRUPTED_EXIT_S = 20
"""How long an interrupted produce or consume may take to exit: a few seconds, with room
for a loaded machine."""


def _interrupted(command: subprocess.Popen[str]) -> str:
    """``command``'s stderr once it has ended after a SIGINT: within a bounded time (the
    client's close after a cancel waits at most 1 s per socket), killed if it does not."""
    try:
        _, err = command.communicate(timeout=INTERRUPTED_EXIT_S)
    finally:
        if command.poll() is None:  # not left sending for the rest of the module
            command.kill()
            command.communicate()
    return err


async def _stored(client: Client, topic: str) -> int:
    return int((await client.admin.stats(topic)).get("msgInCounter", 0))


@pytest.mark.parametrize(
    ("stop", "sigint_ignored"),
    [(signal.SIGINT, False), (signal.SIGINT, True), (signal.SIGTERM, False)],
    ids=["sigint-inherited", "sigint-ignored", "sigterm"],
)
def test_interrupted_produce_and_consume_say_how_far_they_got(
    standalone: str, stop: signal.Signals, sigint_ignored: bool
) -> None:
    """Ctrl-C (SIGINT) in the middle: each says how many messages it stored or consumed,
    and exits with 130.

    Also when started with SIGINT ignored, as a script's background job (and the whole test
    suite, run as one: a CI run so started failed here): Python then raises no
    KeyboardInterrupt, and produce went on sending, its stderr only "sending", until the
    test gave up after 60 s.

    SIGTERM (a supervisor's stop: kubectl delete, systemd) the same way, with exit status
    143: before, Python's default killed the command on the spot, saying nothing of what it
    had stored."""
    said_stop = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}[stop]
    topic = f"persistent://t/ns/stopped-{stop.name}-{int(sigint_ignored)}"

    async def interrupt(
        command: subprocess.Popen[str], progress: Callable[[Client], Awaitable[bool]]
    ) -> None:
        async def under_way(client: Client) -> bool:
            assert command.poll() is None, command.communicate()  # it must not have ended
            return await progress(client)

        async with Client(standalone) as client:
            await wait_until(lambda: under_way(client), timeout=60, what="the command at work")
        command.send_signal(stop)

    async def produced(client: Client) -> bool:
        # with at most a window in flight, the client has the receipts of all but that many
        return await _stored(client, topic) > 2 * ProducerOptions().max_pending

    async def backlog(client: Client) -> int:
        return int((await client.admin.stats(topic))["subscriptions"]["sub"]["backlog"])

    async def consumed(client: Client) -> bool:
        # two acknowledged at the broker: consume is under way
        return await backlog(client) <= left - 2

    assert invoke("topics", "create", topic, "--url", standalone).exit_code == 0
    producing = _segtxn(
        "produce",
        topic,
        "-n",
        "10000000",
        "--size",
        "8",
        "--url",
        standalone,
        sigint_ignored=sigint_ignored,
    )
    asyncio.run(interrupt(producing, produced))
    err = _interrupted(producing)
    assert producing.returncode == 128 + stop, err
    said = re.search(rf"Error: {said_stop}: ([\d,]+) of 10,000,000 messages stored", err)
    assert said is not None, err
    stored = int(said[1].replace(",", ""))
    assert 0 < stored <= asyncio.run(_stored_now(standalone, topic))

    async def subscribed() -> int:
        async with Client(standalone) as client:
            await client.admin.create_subscription(topic, "sub", initial_position="earliest")
            return await backlog(client)

    left = asyncio.run(subscribed())
    consuming = _segtxn(
        "consume",
        topic,
        "sub",
        "--idle-timeout",
        "600",
        "--url",
        standalone,
        sigint_ignored=sigint_ignored,
    )
    asyncio.run(interrupt(consuming, consumed))
    err = _interrupted(consuming)
    assert consuming.returncode == 128 + stop, err
    # "... received and acknowledged", or, stopped while acknowledgments awaited their
    # answers, "... received, M of them acknowledged (... outcome unknown ...)"
    said = re.search(rf"Error: {said_stop}: ([\d,]+) messages received", err)
    assert said is not None and int(said[1].replace(",", "")) > 0, err


async def _stored_now(url: str, topic: str) -> int:
    async with Client(url) as client:
        return await _stored(client, topic)


def test_produce_stops_at_the_first_failed_send(
    standalone: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every send to a terminated topic fails: produce says so once and stops, instead of
    sending the rest and leaving every failed send's error for asyncio to log at exit (a
    traceback per send, thousands of them)."""
    topic = "persistent://t/ns/ended"

    async def terminated() -> None:
        async with Client(standalone) as client:
            await client.admin.create_topic(topic)
            await client.admin.terminate(topic)

    asyncio.run(terminated())
    sends = 0
    send_async = Producer.send_async

    async def counted(self: Producer, *args: Any, **kwargs: Any) -> asyncio.Future[MessageId]:
        nonlocal sends
        sends += 1
        return await send_async(self, *args, **kwargs)

    monkeypatch.setattr(Producer, "send_async", counted)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        result = invoke("produce", topic, "-n", "100000", "--size", "8", "--url", standalone)
        gc.collect()  # a future whose error nobody retrieved says so when it is freed
    assert result.exit_code == 1, result.output
    assert sends <= 2 * ProducerOptions().max_pending  # a window's worth, not all 100,000
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
    error = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    [line] = error
    said = (
        r"Error: failed \(0 of 100,000 messages stored; ([\d,]+) refused\): TopicTerminatedError: "
    )
    assert re.fullmatch(said + f"{topic} is sealed", line), result.stderr


def test_verify_run_again_with_the_same_run_name_is_one_line(
    standalone: str, tmp_path: Path
) -> None:
    async def first_run() -> None:  # what a first `verify run --run again` leaves
        async with Client(standalone) as client:
            await client.admin.create_topic("topic://verify/again/input", segments=2)

    asyncio.run(first_run())
    result = invoke(
        "verify", "run", "--url", standalone, "--run-dir", str(tmp_path / "r2"), "--run", "again"
    )
    assert result.exit_code == 1
    line = result.stderr.splitlines()[-1]
    assert "Traceback" not in result.stderr
    assert line.startswith("Error: run 'again' was run on this cluster before")
    assert line.endswith("give --run a new name")


async def _refused_connection(port: int) -> aiohttp.ClientConnectorError:
    """The error aiohttp raises for a connection nothing accepts."""
    async with aiohttp.ClientSession() as session:
        try:
            await session.get(f"http://127.0.0.1:{port}/")
        except aiohttp.ClientConnectorError as e:
            return e
    raise AssertionError("connected to a port nothing listens on")


def test_a_failure_to_reach_another_broker_names_both() -> None:
    """A connection refused by a broker other than the service URL (one a lookup sent the
    client to) names that broker and the service URL."""
    dead = free_port()
    cause = asyncio.run(_refused_connection(dead))
    try:
        raise ServerError(ErrorName.SERVICE_NOT_READY, f"cannot reach x: {cause!r}") from cause
    except ServerError as e:
        failure = service.connection_failure(e, "http://127.0.0.1:8080")
    assert failure is not None
    assert str(failure) == (
        f"cannot reach the broker at 127.0.0.1:{dead} (the cluster at http://127.0.0.1:8080 "
        "sent this client there): connection refused"
    )


def test_a_connection_repr_in_a_message_is_said_in_words() -> None:
    """The client lists every service URL it could not reach in one message, with aiohttp's
    reprs and no cause to read them from: the one line says them in words."""
    dead = free_port()
    cause = asyncio.run(_refused_connection(dead))
    url = f"http://127.0.0.1:{dead}/lookup/v2/topic/topic/a/b/c"
    error = ServerError(ErrorName.SERVICE_NOT_READY, f"cannot reach {url}: {cause!r}")
    assert describe(error) == f"ServiceNotReady: cannot reach {url}: connection refused"


def test_several_service_urls_none_reachable_are_each_named() -> None:
    first, second = free_port(), free_port()
    urls = f"http://127.0.0.1:{first},http://127.0.0.1:{second}"
    result = invoke("topics", "stats", "topic://a/b/c", "--url", urls)
    assert result.exit_code == 1
    assert one_line(result) == (
        f"Error: cannot reach any of http://127.0.0.1:{first} (connection refused), "
        f"http://127.0.0.1:{second} (connection refused); is a segtxn broker running there? "
        "(--url or SEGTXN_URL names another)"
    )


def test_one_reachable_service_url_of_several_is_enough(standalone: str) -> None:
    urls = f"http://127.0.0.1:{free_port()},{standalone}"
    result = invoke("topics", "create", "topic://t/ns/several", "--url", urls)
    assert result.exit_code == 0, result.output
