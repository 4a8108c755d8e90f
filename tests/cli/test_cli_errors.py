"""The command line as a hostile new user meets it (issue 15, item 5): every error is one
line on stderr with a non-zero exit and no traceback (unless ``-vv``); numbers, URLs,
hashes, ports and names are checked when parsed; options that do not apply are refused;
connection failures name the URL and say why in words.

Argument errors run the real entry point in-process (click's CliRunner); the cases that
need a cluster are in test_cli_against_a_server.py.
"""

from __future__ import annotations

import errno
import signal
from pathlib import Path

import aiohttp
import pytest
from aiohttp.client_reqrep import ConnectionKey
from click.testing import CliRunner, Result

from segtxn.cli import topics
from segtxn.cli.commands import main
from segtxn.cli.errors import answer_lost, unreachable
from segtxn.client import ConnectionLost, ErrorCategory, ServiceNotReady
from segtxn.metastore.etcd_server import free_port


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
AUTOSCALE = ["topics", "autoscale", T, "--policy"]
NOT_A_URL = "is not a URL of the form http://host:port"

USAGE_ERRORS = [
    # (arguments, what the one line must say)
    (["produce", "--url", "127.0.0.1:8080", T], NOT_A_URL),
    (["produce", "--url", "http://h:99999", T], "the port must be a number from 0 to 65535"),
    (["produce", "-n", "-5", T], "-5 is not in the range x>=1"),
    (["produce", "-n", "0", T], "0 is not in the range x>=1"),
    (["produce", "--keys", "-2", T], "-2 is not in the range x>=0"),
    (["produce", "--size", "99999999", T], "not in the range 8<=x<=5177344"),
    (["produce", "--size", "5177345", T], "not in the range 8<=x<=5177344"),
    (["produce", "-m", "hi", "--size", "10", T], "--size does not apply here"),
    (["produce", "segment://a/b/c/0"], "this command takes a topic:// or persistent:// topic"),
    (["produce", "not a topic"], "expected domain://tenant/namespace/name"),
    (["consume", T, "s", "--idle-timeout", "-1"], "not in the range 0<x<="),
    (["consume", T, "s", "-n", "-3"], "-3 is not in the range x>=0"),
    (["consume", T, " "], "a subscription needs a name"),
    # the broker refused these only once connected (exit 1), or not at all without one
    (["consume", T, "a b"], "subscription name 'a b' must be 1-64 of letters, digits"),
    (["consume", T, "s" * 65], "must be 1-64 of letters"),
    (["produce", T, "--name", "a/b"], "producer name 'a/b' must be 1-128 of letters"),
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
    # it set and then removed the key, saying nothing of which won
    (
        ["topics", "properties", T, "--set", "a=1", "--set", "b=2", "--remove", "a"],
        "'a' is both set (--set) and removed (--remove): which should win? give it to one",
    ),
    (["txn", "list", "--limit", "0"], "0 is not in the range 1<=x<=10000"),
    (["txn", "list", "--limit", "50000"], "50000 is not in the range 1<=x<=10000"),
    (["brokers", "homes", ""], "'' is not a broker id"),
    (["brokers", "drain", "a b"], "'a b' is not a broker id"),
    (["topics", "list", "a/b", "-o", "yaml"], "'yaml' is not one of 'table', 'json'"),
    (["txn", "show", "nonsense"], "Invalid value for TXN_ID: not a transaction id"),
    (["txn", "abort", "1:zz"], "Invalid value for TXN_ID: not a transaction id"),
    (["standalone", "--port", "99999"], "99999 is not in the range 0<=x<=65535"),
    (["standalone", "--coordinator-port", "-1"], "-1 is not in the range 0<=x<=65535"),
    (["standalone", "--port", "8999", "--coordinator-port", "8999"], "is the broker's --port"),
    (["standalone", "--store", "zookeeper://x"], "unknown metadata store URL"),
    (["standalone", "--data-dir", "x"], "--data-dir needs --store etcd://"),
    (["standalone", "--store-timeout", "-1"], "-1.0 is not in the range 0<=x<="),
    (["standalone", "--shutdown-timeout", "0"], "0.0 is not in the range 0<x<="),
    (["standalone", "--shutdown-timeout", "nan"], "'nan' is not a number"),
    (["standalone", "--store-timeout", "NaN"], "'NaN' is not a number"),
    (["consume", T, "s", "--idle-timeout", "nan"], "'nan' is not a number"),
    (["topics", "autoscale", T, "--window", "nan"], "'nan' is not a number"),
    # a misspelt knob kept its default silently: --apply then did not split at the rate asked
    ([*AUTOSCALE, '{"split": {"msgRatein": 100}}'], "unknown knob split.msgRatein"),
    ([*AUTOSCALE, '{"maxsegments": 4}'], "unknown knob maxsegments (known: "),
    ([*AUTOSCALE, '{"split": {"windowSeconds": 5}}'], "unknown knob split.windowSeconds"),
    ([*BROKER, "--store", "etcd://"], "expected etcd://host:port"),
    ([*BROKER, "--store", "etcd://h:99999"], "is not host:port (port 1-65535)"),
    ([*BROKER, "--advertise", "h:1"], NOT_A_URL),
    ([*BROKER, "--broker-id", "a b"], "broker id 'a b'"),
    ([*BROKER, "--session-ttl", "0"], "0.0 is not in the range 0<x<="),
    ([*BROKER, "--session-ttl", "nan"], "'nan' is not a number"),
    ([*BROKER, "--port", "65536"], "65536 is not in the range 0<=x<=65535"),
    # a port the system picks: no --advertise but one of port 0 can name it before it is picked
    ([*BROKER, "--port", "0"], "'--port': 0 listens on a port the system picks, which --advert"),
    ([*COORDINATOR, "--port", "0"], "advertise port 0 (http://h:0) to advertise the port picked"),
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


def test_a_connection_lost_with_its_send_written_is_an_answer_lost() -> None:
    """A send or an acknowledgment written before its broker could no longer be reached
    (OUTCOME_UNKNOWN) may have been done: an answer lost, not a connection never made,
    though the last attempt to reach the broker was refused. One never written
    (RETRIABLE) did nothing: the refused connection says it."""
    refused = aiohttp.ClientConnectorError(
        ConnectionKey("127.0.0.1", 1, False, True, None, None, None),
        ConnectionRefusedError(errno.ECONNREFUSED, "refused"),
    )
    for category, lost in ((ErrorCategory.OUTCOME_UNKNOWN, True), (ErrorCategory.RETRIABLE, False)):
        error = ConnectionLost("message 7: no receipt", category=category)
        error.__cause__ = ServiceNotReady("cannot reach http://127.0.0.1:1: connection refused")
        error.__cause__.__cause__ = refused
        assert answer_lost(error) is lost, category
        assert (unreachable(error) is None) is lost, category


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


def test_sigint_interrupts_a_command_of_a_process_started_ignoring_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process started with SIGINT ignored (a script's background job) is still
    interrupted by one during a command, as its servers are (before, the signal was
    ignored: an interrupted ``produce`` went on sending); the caller's own disposition is
    back after the command."""

    def interrupted(*_: object) -> None:
        signal.raise_signal(signal.SIGINT)  # its handler runs before this returns
        raise AssertionError("SIGINT was ignored")

    monkeypatch.setattr(topics, "run", interrupted)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        result = invoke("topics", "stats", "topic://a/b/c")
        after = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert result.exit_code == 130, result.output
    assert result.stderr == "Error: interrupted\n"  # one line: not after an empty one
    assert after == signal.SIG_IGN


def test_sigterm_stops_a_command_as_sigint_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM (a supervisor's stop) during a command is its one line and exit status 143
    (before, Python's default killed the process on the spot); SIGTERM's default is back
    after the command."""

    def terminated(*_: object) -> None:
        handler = signal.getsignal(signal.SIGTERM)
        assert handler != signal.SIG_DFL, "unhandled, SIGTERM would end the test process"
        signal.raise_signal(signal.SIGTERM)  # its handler runs before this returns
        raise AssertionError("SIGTERM did not stop the command")

    monkeypatch.setattr(topics, "run", terminated)
    # as a process starts
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    previous_sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        result = invoke("topics", "stats", "topic://a/b/c")
        after = signal.getsignal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_sigint)
    assert result.exit_code == 143, result.output
    assert result.stderr == "Error: terminated\n"
    assert after == signal.SIG_DFL
