"""The command line as a hostile new user meets it (issue 15, item 5): every error is one
line on stderr with a non-zero exit and no traceback (unless ``-vv``); numbers, URLs,
hashes, ports and names are checked when parsed; options that do not apply are refused;
connection failures name the URL and say why in words.

Argument errors run the real entry point in-process (click's CliRunner); the cases that
need a cluster run against a real ``segtxn standalone`` process.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import re
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner, Result

from segtxn.cli import main, service, topics
from segtxn.cli.errors import describe
from segtxn.client import Client, ErrorName, MessageId, ServerError
from segtxn.client.producer import Producer, ProducerOptions
from segtxn.metastore.etcd_server import free_port
from tests import processes
from tests.waiting import wait_until


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env)


def one_line(result: Result) -> str:
    """The single stderr line of a failed command (and nothing on stdout)."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


T = "topic://a/b/c"
BROKER = ["broker", "--store", "memory://", "--data-dir", "d", "--advertise", "http://h:1"]
COORDINATOR = ["coordinator", "--store", "memory://", "--advertise", "http://h:1"]
RUN = ["verify", "run", "--url", "http://h:1", "--run-dir", "r"]
SPLIT = ["topics", "split", T, "0", "--at"]
NOT_A_URL = "is not a URL of the form http://host:port"

USAGE_ERRORS = [
    # (arguments, what the one line must say)
    (["produce", "--url", "127.0.0.1:8080", T], NOT_A_URL),
    (["produce", "--url", "http://h:99999", T], "the port must be a number from 0 to 65535"),
    (["produce", "-n", "-5", T], "-5 is not in the range x>=1"),
    (["produce", "-n", "0", T], "0 is not in the range x>=1"),
    (["produce", "--keys", "-2", T], "-2 is not in the range x>=0"),
    (["produce", "--size", "99999999", T], "not in the range 8<=x<=5242880"),
    (["produce", "-m", "hi", "--size", "10", T], "--size does not apply here"),
    (["produce", "segment://a/b/c/0"], "this command takes a topic:// or persistent:// topic"),
    (["produce", "not a topic"], "expected domain://tenant/namespace/name"),
    (["consume", T, "s", "--idle-timeout", "-1"], "not in the range 0<x<="),
    (["consume", T, "s", "-n", "-3"], "-3 is not in the range x>=0"),
    (["consume", T, " "], "a subscription needs a name"),
    (
        ["topics", "create", "persistent://a/b/c", "--segments", "4"],
        "--segments does not apply here: only a topic:// topic has segments",
    ),
    (["topics", "create", T, "--segments", "0"], "0 is not in the range 1<=x<=256"),
    ([*SPLIT, "0xZZ"], "'0xZZ' is not a hash"),
    ([*SPLIT, "0x10000"], "outside the hash space 0x0000-0xffff"),
    ([*SPLIT, "-5"], "outside the hash space"),
    (["topics", "split", "persistent://a/b/c", "0"], "this command takes a topic:// topic"),
    (["topics", "split", T, "x"], "'x' is not a valid integer"),
    (["topics", "merge", T, "1", "1"], "a segment cannot be merged with itself"),
    (["topics", "list", "a/b/c"], "'a/b/c' is not tenant/namespace"),
    (["topics", "list", "t" * 65 + "/ns"], "is not tenant/namespace (each 1-64 of"),
    (["topics", "properties", T, "--set", "=x"], "expected KEY=VALUE with a KEY"),
    (["topics", "properties", T, "--set", "novalue"], "expected KEY=VALUE"),
    (["txn", "list", "--limit", "0"], "0 is not in the range 1<=x<=10000"),
    (["txn", "list", "--limit", "50000"], "50000 is not in the range 1<=x<=10000"),
    (["brokers", "homes", ""], "'' is not a broker id"),
    (["brokers", "drain", "a b"], "'a b' is not a broker id"),
    (["topics", "list", "a/b", "-o", "yaml"], "'yaml' is not one of 'table', 'json'"),
    (["txn", "show", "nonsense"], "not a transaction id"),
    (["standalone", "--port", "99999"], "99999 is not in the range 0<=x<=65535"),
    (["standalone", "--coordinator-port", "-1"], "-1 is not in the range 0<=x<=65535"),
    (["standalone", "--store", "zookeeper://x"], "unknown metadata store URL"),
    (["standalone", "--data-dir", "x"], "--data-dir needs --store etcd://"),
    (["standalone", "--store-timeout", "-1"], "-1.0 is not in the range 0<=x<="),
    (["standalone", "--shutdown-timeout", "0"], "0.0 is not in the range 0<x<="),
    (["standalone", "--shutdown-timeout", "nan"], "'nan' is not a number"),
    (["standalone", "--store-timeout", "NaN"], "'NaN' is not a number"),
    (["consume", T, "s", "--idle-timeout", "nan"], "'nan' is not a number"),
    (["topics", "autoscale", T, "--window", "nan"], "'nan' is not a number"),
    ([*BROKER, "--store", "etcd://"], "expected etcd://host:port"),
    ([*BROKER, "--store", "etcd://h:99999"], "is not host:port (port 1-65535)"),
    ([*BROKER, "--advertise", "h:1"], NOT_A_URL),
    ([*BROKER, "--broker-id", "a b"], "broker id 'a b'"),
    ([*BROKER, "--session-ttl", "0"], "0.0 is not in the range 0<x<="),
    ([*BROKER, "--session-ttl", "nan"], "'nan' is not a number"),
    ([*BROKER, "--port", "65536"], "65536 is not in the range 0<=x<=65535"),
    (["broker", "--store", "memory://", "--advertise", "http://h:1"], "option '--data-dir'"),
    (["standalone", "--host", "999.1.1.1"], "'--host': cannot listen on 999.1.1.1: name or"),
    (["standalone", "--host", "192.0.2.1"], "cannot listen on 192.0.2.1: cannot assign requested"),
    ([*COORDINATOR, "--v4-ids", "3"], "--v4-ids does not apply here: v4 transactions need"),
    ([*COORDINATOR, "--ids", "0"], "0 is not in the range 1<=x<=1024"),
    ([*COORDINATOR, "--replication", "3"], "replication '3': write it W/A, e.g. 3/2"),
    ([*COORDINATOR, "--replication", "3/3"], "at most a majority of it (2A <= W + 1"),
    ([*COORDINATOR, "--default-timeout", "7200"], "7200.0 is not in the range 0<x<=3600"),
    ([*RUN, "--inputs", "-1"], "-1 is not in the range x>=1"),
    ([*RUN, "--abort-rate", "2"], "2.0 is not in the range 0<=x<=1"),
    ([*RUN, "--abort-rate", "nan"], "'nan' is not a number"),
    ([*RUN, "--run", "a b"], "it names the run's topics"),
    ([*RUN, "--abort-rate", "0.7", "--timeout-rate", "0.5"], "add up to more than 1"),
    (["demo", "--store", "zookeeper://nowhere"], "unknown metadata store URL"),
    (["operator", "-n", "Bad_NS"], "is not a Kubernetes namespace name"),
    (["operator", "--broker-url", "localhost:8080"], NOT_A_URL),
    (["operator", "-n", "a", "--all-namespaces"], "exclude each other"),
]


@pytest.mark.parametrize(("args", "says"), USAGE_ERRORS, ids=[" ".join(a) for a, _ in USAGE_ERRORS])
def test_bad_input_is_one_usage_line(
    args: list[str], says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # relative paths in the arguments land here
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    line = one_line(result)
    assert line.startswith("Error: ") and says in line, line
    assert line.endswith("--help')"), line  # where to read more
    assert result.stdout == ""


def test_version_and_the_service_url_variable_in_help() -> None:
    result = invoke("--version")
    assert result.exit_code == 0 and result.stdout.startswith("segtxn ")
    for command in (["produce"], ["topics", "create"], ["txn", "list"], ["verify", "run"]):
        shown = invoke(*command, "--help")
        assert shown.exit_code == 0
        assert "env var: SEGTXN_URL" in " ".join(shown.stdout.split()), shown.stdout
    assert "--store-timeout" in invoke("broker", "--help").stdout
    assert "--shutdown-timeout" in invoke("standalone", "--help").stdout
    assert "--api-timeout" in invoke("operator", "--help").stdout


def test_a_group_without_a_command_shows_its_help() -> None:
    for args in ([], ["topics"], ["txn"], ["verify"]):
        result = invoke(*args)
        assert result.exit_code == 0 and result.stdout.startswith("Usage: "), result.output
        assert result.stderr == ""


def test_a_bad_service_url_in_the_environment_is_named() -> None:
    result = invoke("topics", "stats", "topic://a/b/c", env={"SEGTXN_URL": "localhost:8080"})
    assert result.exit_code == 2
    assert "(env var: 'SEGTXN_URL'): 'localhost:8080' is not a URL" in one_line(result)


def test_verify_check_wants_a_recorded_run(tmp_path: Path) -> None:
    result = invoke("verify", "check", "--run-dir", str(tmp_path))
    assert result.exit_code == 2
    assert f"{tmp_path} holds no recorded run (no run.json)" in one_line(result)


def test_verify_check_without_a_run_dir_wants_the_run_in_topics() -> None:
    result = invoke("verify", "check", "--url", "http://127.0.0.1:1")
    assert result.exit_code == 2
    assert "give --run-dir, or --url and --run for a run recorded in topics" in one_line(result)
    result = invoke("verify", "check", "--url", "http://127.0.0.1:1", "--run", "a/b")
    assert result.exit_code == 2
    assert "'a/b': 1-128 of A-Z a-z 0-9 _ . = - (it names the run's topics)" in one_line(result)
    result = invoke("verify", "run", "--url", "http://127.0.0.1:1", "--history", "s3")
    assert result.exit_code == 2
    assert "Invalid value for '--history': 's3' is not one of" in one_line(result)


def test_verify_soak_refuses_seed_directories_of_an_earlier_soak(tmp_path: Path) -> None:
    (tmp_path / "seed-8").mkdir()  # empty: nothing to mix up
    (tmp_path / "seed-9" / "history").mkdir(parents=True)
    result = invoke("verify", "soak", "--out", str(tmp_path), "--seed", "8", "--runs", "3")
    assert result.exit_code == 2
    line = one_line(result)
    assert f"{tmp_path} already holds seed-9 from an earlier soak: give a new directory" in line
    assert not (tmp_path / "seed-10").exists()


def test_verify_run_refuses_a_directory_that_holds_a_run(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text("{}")
    result = invoke("verify", "run", "--url", "http://127.0.0.1:1", "--run-dir", str(tmp_path))
    assert result.exit_code == 2
    assert "already holds a recorded run: give a new directory" in one_line(result)


def test_a_data_dir_that_cannot_be_made_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = invoke(
        "broker", "--store", "memory://", "--data-dir", str(blocker / "d"),
        "--advertise", "http://127.0.0.1:1",
    )  # fmt: skip
    assert result.exit_code == 2
    assert f"Invalid value for '--data-dir': {blocker / 'd'} cannot be used" in one_line(result)


# ------------------------------------------------------------------ connection failures


def test_a_refused_connection_names_the_url_in_words() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    for args in (
        ["produce", "topic://a/b/c"],
        ["consume", "topic://a/b/c", "s"],
        ["topics", "stats", "topic://a/b/c"],
        ["txn", "list"],
    ):
        result = invoke(*args, "--url", url)
        assert result.exit_code == 1
        assert one_line(result) == (
            f"Error: cannot reach {url}: connection refused; is a segtxn broker running "
            "there? (--url or SEGTXN_URL names another)"
        )


def test_a_host_that_does_not_resolve_is_said_so() -> None:
    result = invoke("topics", "stats", "topic://a/b/c", "--url", "http://no-such-host.invalid:80")
    assert result.exit_code == 1
    line = one_line(result)
    assert "cannot reach http://no-such-host.invalid:80: the host name does not resolve" in line
    assert "ConnectionKey" not in line


def test_an_unexpected_error_is_one_line_and_its_traceback_only_with_vv(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*_: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(topics, "run", broken)
    result = invoke("topics", "stats", "topic://a/b/c")
    assert result.exit_code == 1
    assert one_line(result) == (
        "Error: internal error: RuntimeError: boom (segtxn -vv ... shows the traceback)"
    )
    verbose = invoke("-vv", "topics", "stats", "topic://a/b/c")
    assert verbose.exit_code == 1
    assert "Traceback" in verbose.stderr
    assert verbose.stderr.splitlines()[-1] == "Error: internal error: RuntimeError: boom"
    after = invoke("topics", "stats", "topic://a/b/c", "-vv")  # -v after the command too
    assert after.exit_code == 1 and "Traceback" in after.stderr


# ------------------------------------------------------------------ against a real cluster


@pytest.fixture(scope="module")
def standalone() -> Iterator[str]:
    server = processes.standalone()
    server.start()
    try:
        asyncio.run(server.ready())
        yield server.url
    finally:
        server.stop()


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
    assert one_line(unknown) == "Error: ServiceNotReady: broker nobody is not registered"


def test_produce_reports_what_it_sent(standalone: str) -> None:
    invoke("topics", "create", "topic://t/ns/rate", "--url", standalone)
    result = invoke("produce", "topic://t/ns/rate", "-n", "5", "--keys", "2", "--url", standalone)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("sent 5 messages in ")


def _segtxn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "segtxn.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def _stored(client: Client, topic: str) -> int:
    return int((await client.admin.stats(topic)).get("msgInCounter", 0))


def test_interrupted_produce_and_consume_say_how_far_they_got(standalone: str) -> None:
    """Ctrl-C (SIGINT) in the middle: each says how many messages it stored or consumed,
    and exits with 130."""
    topic = "persistent://t/ns/interrupted"

    async def interrupt(
        command: subprocess.Popen[str], progress: Callable[[Client], Awaitable[bool]]
    ) -> None:
        async def under_way(client: Client) -> bool:
            assert command.poll() is None, command.communicate()  # it must not have ended
            return await progress(client)

        async with Client(standalone) as client:
            await wait_until(lambda: under_way(client), timeout=60, what="the command at work")
        command.send_signal(signal.SIGINT)

    async def produced(client: Client) -> bool:
        # with at most a window in flight, the client has the receipts of all but that many
        return await _stored(client, topic) > 2 * ProducerOptions().max_pending

    async def backlog(client: Client) -> int:
        return int((await client.admin.stats(topic))["subscriptions"]["sub"]["backlog"])

    async def consumed(client: Client) -> bool:
        # it acknowledges one at a time, once the last is durable: two acknowledged means
        # the first one's acknowledgment returned
        return await backlog(client) <= left - 2

    assert invoke("topics", "create", topic, "--url", standalone).exit_code == 0
    producing = _segtxn("produce", topic, "-n", "10000000", "--size", "8", "--url", standalone)
    asyncio.run(interrupt(producing, produced))
    _, err = producing.communicate(timeout=60)
    assert producing.returncode == 130, err
    said = re.search(r"Error: interrupted: ([\d,]+) of 10,000,000 messages stored", err)
    assert said is not None, err
    stored = int(said[1].replace(",", ""))
    assert 0 < stored <= asyncio.run(_stored_now(standalone, topic))

    async def subscribed() -> int:
        async with Client(standalone) as client:
            await client.admin.create_subscription(topic, "sub", initial_position="earliest")
            return await backlog(client)

    left = asyncio.run(subscribed())
    consuming = _segtxn("consume", topic, "sub", "--idle-timeout", "600", "--url", standalone)
    asyncio.run(interrupt(consuming, consumed))
    _, err = consuming.communicate(timeout=60)
    assert consuming.returncode == 130, err
    said = re.search(r"Error: interrupted: ([\d,]+) messages received and acknowledged", err)
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
