"""The harness's processes: every incarnation logged behind a marker, the environment and the
verbosity passed down, a crash told from a kill, stacks dumped on request; and the history
tail that tells the faults when to strike."""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path

import pytest

from segtxn.verify.history import FileHistory, FileTail
from segtxn.verify.processes import (
    DUMP_END,
    MARKER,
    TEST_BUGS_ENV,
    Launch,
    ManagedProcess,
    ServerFailed,
    ServerProcess,
)

PRINT_ENV = [sys.executable, "-c", f"import os; print('bug:', os.environ['{TEST_BUGS_ENV}'])"]
SERVER_STAND_IN = "import time; print('up', flush=True); time.sleep(60)"  # sleep-ok: a child
SLEEP = [sys.executable, "-c", SERVER_STAND_IN]


async def test_each_incarnation_is_logged_with_its_environment(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "x.log"
    process = ManagedProcess("x", PRINT_ENV, log, Launch(env={TEST_BUGS_ENV: "fence-race"}))
    await process.start()
    assert process.process is not None
    await process.process.wait()
    await process.start("again")
    assert process.process is not None
    await process.process.wait()
    await process.stop()
    text = log.read_text()
    assert text.count("bug: fence-race") == 2
    assert f"x: incarnation 1 (start): {sys.executable} -c" in text
    assert f"[env {TEST_BUGS_ENV}=fence-race]" in text
    assert "x: incarnation 2 (again)" in text
    # both ended by themselves: told apart from a kill or a stop
    assert process.exited_on_its_own == [0, 0]
    assert "incarnation 1 had exited by itself, exit code 0" in text


async def test_a_kill_or_a_stop_is_not_a_crash(tmp_path: Path) -> None:
    log = tmp_path / "y.log"
    process = ManagedProcess("y", SLEEP, log, Launch())
    await process.start()
    await process.kill("a fault")
    await process.start("restart after SIGKILL")
    process.send(signal.SIGSTOP)
    assert await process.stop(limit_s=10) == -signal.SIGTERM  # continued, then terminated
    assert process.exited_on_its_own == []
    lines = [line for line in log.read_text().splitlines() if line.startswith(MARKER)]
    assert [line.split(" y: ", 1)[1].split(" (")[0].removesuffix(" ====") for line in lines] == [
        "incarnation 1",
        "incarnation 1 SIGKILLed",
        "incarnation 2",
        f"incarnation 2 ended, exit code {-signal.SIGTERM}",
    ]


async def test_a_segtxn_server_gets_the_verbosity_and_dumps_its_stacks(tmp_path: Path) -> None:
    launch = Launch(verbosity=1)

    def command_on(port: int) -> list[str]:
        return launch.segtxn("standalone", "--host", "127.0.0.1", "--port", str(port))

    assert command_on(0)[3:5] == ["-v", "standalone"]
    server = ServerProcess("standalone", command_on, tmp_path / "s.log", launch, coordinator=True)
    await server.start()
    try:
        await server.ready()
        picked = server.port  # port 0: the port it picked, read from its serving line
        assert picked and server.url == f"http://127.0.0.1:{picked}"
        coordinator = server.coordinator_port  # and its coordinator's, from the next line
        assert coordinator and coordinator != picked
        await server.dump_stacks(limit_s=30)
        assert server.running  # SIGUSR1 dumps and goes on
        await server.kill("a fault")
        await server.start("restart after SIGKILL")  # on the port its clients know
        await server.ready()
        assert (server.port, server.coordinator_port) == (picked, coordinator)
        assert any(
            "incarnation 2 (restart after SIGKILL)" in line
            and f"--port {picked}" in line
            and f"--coordinator-port {coordinator}" in line
            for line in (tmp_path / "s.log").read_text().splitlines()
        )
    finally:
        await server.stop()
    text = (tmp_path / "s.log").read_text()
    assert "INFO segtxn.broker.service" in text  # -v reached it: its INFO lines are in its log
    assert "asyncio tasks ====" in text and "-- task broker-registration" in text
    assert DUMP_END in text
    assert server.exited_on_its_own == []


async def test_a_server_that_never_says_its_port_fails_naming_its_log(tmp_path: Path) -> None:
    log = tmp_path / "quiet.log"
    server = ServerProcess("quiet", lambda port: SLEEP, log, Launch())
    await server.start()
    try:
        expected = f"no 'serving:' line naming its port in 0.5 s (see {log})"
        with pytest.raises(ServerFailed, match=re.escape(expected)):
            await server.ready(limit_s=0.5)
    finally:
        await server.stop()


async def test_the_history_tail_follows_open_transactions_and_commits(tmp_path: Path) -> None:
    directory = tmp_path / "history"
    p1, p2 = FileHistory(directory, "p1"), FileHistory(directory, "p2")
    tail = FileTail(directory, ["p1", "p2", "p3"])
    await tail.poll()
    assert tail.open == {"p1": None, "p2": None, "p3": None}
    p1.record("begin", txn="1:1")
    p2.record("begin", txn="2:1")
    p2.record("committing", txn="2:1")
    await tail.poll()
    assert tail.open == {"p1": "1:1", "p2": "2:1", "p3": None}
    assert (tail.committing, tail.last_committing) == (1, ("p2", "2:1"))
    p2.record("ended", txn="2:1", outcome="committed")
    tear(directory / "p1.jsonl")  # SIGKILLed mid-line
    await tail.poll()
    assert tail.open == {"p1": "1:1", "p2": None, "p3": None}
    tail.forget("p1")
    p1.record("begin", txn="1:2")  # the next incarnation appends to the torn line
    p1.record("begin", txn="1:3")
    await tail.poll()
    assert tail.open["p1"] == "1:3"
    await p1.close()
    await p2.close()


def tear(path: Path) -> None:
    """Half a line at the end of a history file, as a SIGKILL mid-write leaves it."""
    with open(path, "ab") as torn:
        torn.write(b'{"kind": "ended", "txn": "1:1", "outc')
