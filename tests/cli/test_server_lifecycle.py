"""Server processes start and stop as an operator needs (issue 15, item 3): a store or an API
server that cannot be reached ends the process in bounded time with one line on stderr and
exit 1; SIGTERM and SIGINT stop it cleanly (exit 0) in bounded time, while it starts and
while it serves; a shutdown that cannot finish ends at ``--shutdown-timeout`` (exit 1).

Real ``segtxn`` processes; "during start-up" is made certain, not timed: the store is a
socket that accepts connections and never answers, and the signal goes once the process
has connected to it.
"""

from __future__ import annotations

import asyncio
import gc
import os
import re
import signal
import socket
import subprocess
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import click
import pytest

from segtxn.cli import lifecycle, loops
from segtxn.client import Client
from segtxn.metastore.etcd_server import EtcdServer, free_port
from tests.processes import SEGTXN, wait_ready
from tests.waiting import wait_until

START_S = 20.0
"""How long a process may take to start Python and import everything on a busy machine
(the bounds below add it to what is being measured)."""
STOP_S = 10.0
"""How long a clean stop may take after the signal."""


class Run:
    """A ``segtxn`` process whose stderr is kept in a file (read when it has exited)."""

    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.stderr_path = tmp_path / f"stderr-{time.monotonic_ns()}.txt"
        self.started = time.monotonic()
        with self.stderr_path.open("wb") as stderr:
            self.proc = subprocess.Popen(
                [SEGTXN, *args], stdout=subprocess.DEVNULL, stderr=stderr, env=env
            )

    def signal(self, sig: signal.Signals) -> float:
        """Send ``sig``; return when (monotonic) it was sent."""
        self.proc.send_signal(sig)
        return time.monotonic()

    def wait(self, limit_s: float) -> tuple[int, float, list[str]]:
        """Exit code, seconds since start, stderr lines; SIGKILL and fail after ``limit_s``."""
        try:
            code = self.proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"still running after {limit_s} s; stderr: {self.stderr_path.read_text()}"
            ) from None
        return code, time.monotonic() - self.started, self.stderr_path.read_text().splitlines()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def runs() -> Iterator[list[Run]]:
    """Every process a test starts is SIGKILLed at its end if still running."""
    started: list[Run] = []
    yield started
    for run in started:
        run.kill()


class Blackhole:
    """A TCP port that accepts connections and never answers: a store or an API server
    that hangs. ``connected`` tells when a process has connected."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.setblocking(False)
        self.port = int(self.sock.getsockname()[1])
        self.accepted: list[socket.socket] = []

    def connected(self) -> bool:
        try:
            conn, _ = self.sock.accept()
        except BlockingIOError:
            return bool(self.accepted)
        self.accepted.append(conn)
        return True

    def close(self) -> None:
        for conn in self.accepted:
            conn.close()
        self.sock.close()


@pytest.fixture
def blackhole() -> Iterator[Blackhole]:
    hole = Blackhole()
    yield hole
    hole.close()


def server_args(command: str, store: str, tmp_path: Path, *extra: str) -> list[str]:
    """On a port the server picks (port 0) and names on its ``serving:`` line (a port
    picked here and closed again could be taken by another process before the server
    binds it: address already in use)."""
    if command == "broker":
        return [
            "broker", "--store", store, "--data-dir", str(tmp_path / "data"),
            "--advertise", "http://127.0.0.1:0", "--host", "127.0.0.1", *extra,
        ]  # fmt: skip
    if command == "coordinator":
        return [
            "coordinator", "--store", store, "--advertise", "http://127.0.0.1:0",
            "--host", "127.0.0.1", *extra,
        ]  # fmt: skip
    return ["standalone", "--store", store, "--port", "0", *extra]


def kubeconfig(tmp_path: Path, port: int) -> dict[str, str]:
    """An environment whose kubeconfig points at ``127.0.0.1:port``."""
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
    )
    return {"KUBECONFIG": str(config), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}


# ------------------------------------------------------------------ an unreachable store


@pytest.mark.parametrize("command", ["broker", "coordinator", "standalone"])
def test_a_dead_store_port_ends_the_process_with_one_line(
    command: str, tmp_path: Path, runs: list[Run]
) -> None:
    store = f"etcd://127.0.0.1:{free_port()}"  # nothing listens there
    runs.append(
        run := Run(tmp_path, *server_args(command, store, tmp_path, "--store-timeout", "2"))
    )
    code, elapsed, lines = run.wait(START_S + 2)
    assert code == 1, lines
    name = "broker standalone" if command == "standalone" else command
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"Error: {name}"), lines
    assert (
        f"could not start: metadata store {store}: StoreUnavailable: not reachable within 2 s"
        in lines[0]
    )
    assert "Connection refused" in lines[0]
    assert elapsed >= 2  # it kept trying for --store-timeout


def test_a_store_that_never_answers_is_given_up_at_the_timeout(
    tmp_path: Path, runs: list[Run], blackhole: Blackhole
) -> None:
    store = f"etcd://127.0.0.1:{blackhole.port}"
    args = server_args("broker", store, tmp_path, "--store-timeout", "3")
    runs.append(run := Run(tmp_path, *args))
    code, elapsed, lines = run.wait(START_S + 3)
    assert code == 1 and len(lines) == 1, lines
    assert "could not start: metadata store" in lines[0] and "within 3 s" in lines[0]
    assert elapsed >= 3


@pytest.mark.parametrize("command", ["broker", "coordinator", "standalone"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_start_up_stops_the_process_cleanly(
    command: str, sig: signal.Signals, tmp_path: Path, runs: list[Run], blackhole: Blackhole
) -> None:
    store = f"etcd://127.0.0.1:{blackhole.port}"
    args = server_args(command, store, tmp_path, "--store-timeout", "300")
    runs.append(run := Run(tmp_path, *args))
    asyncio.run(wait_until(blackhole.connected, timeout=START_S, what="the store connection"))
    sent = run.signal(sig)
    code, _, lines = run.wait(STOP_S)
    assert time.monotonic() - sent < STOP_S
    assert code == 0, lines
    assert f"{sig.name} while starting: stopping" in lines, lines
    assert not any("Traceback" in line or line.startswith("Error") for line in lines), lines


# ------------------------------------------------------------------ while serving


async def test_sigterm_while_serving_stops_standalone_and_says_what_it_closed(
    tmp_path: Path, runs: list[Run]
) -> None:
    runs.append(run := Run(tmp_path, "standalone", "--port", "0"))
    await wait_ready(await standalone_url(run), "standalone", START_S)
    sent = run.signal(signal.SIGTERM)
    code, _, lines = await asyncio.to_thread(run.wait, STOP_S)
    assert time.monotonic() - sent < STOP_S
    assert code == 0, lines
    assert "SIGTERM: stopping the servers" in lines
    closed = [line for line in lines if line.startswith("closed ")]
    assert len(closed) == 2, lines  # in reverse order of starting
    assert closed[0].startswith("closed coordinator http://127.0.0.1:"), lines
    assert closed[1].startswith("closed broker standalone in "), lines


async def test_a_signal_repeated_at_once_is_the_first_one_and_a_later_one_exits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GNU ``timeout`` sends the signal it gets to its child and then to the child's process
    group: when the two were not merged by the kernel, the server took the second for an
    impatient user's and exited 1 without finishing its shutdown. Driven here through the
    handler itself: whether two real signals merge is the kernel's timing."""
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", exits.append)  # lifecycle calls os._exit
    said: list[str] = []
    signals = lifecycle._Signals(said.append)
    try:
        signals._on(signal.SIGINT)
        signals._on(signal.SIGINT)  # the same delivery, repeated to the group
        assert signals.received.is_set() and exits == [] and said == []
        signals._on(signal.SIGTERM)  # another signal: someone wants it gone now
        assert exits == [1] and said == ["second SIGTERM: exiting without finishing the shutdown"]
        signals._first_at -= lifecycle.REPEATED_S  # the same one, later: a person's second
        signals._on(signal.SIGINT)
        assert exits == [1, 1]
    finally:
        signals.remove()


async def test_what_start_up_left_alive_is_frozen_once_serving(
    tmp_path: Path, runs: list[Run]
) -> None:
    runs.append(run := Run(tmp_path, "standalone", "-v", "--port", "0"))
    await wait_ready(await standalone_url(run), "standalone", START_S)
    run.signal(signal.SIGTERM)
    code, _, lines = await asyncio.to_thread(run.wait, STOP_S)
    assert code == 0, lines
    frozen = [m for line in lines if (m := re.search(r"froze (\d+) start-up objects", line))]
    assert len(frozen) == 1, lines
    assert int(frozen[0].group(1)) > 10_000  # modules, classes, the servers: not a handful
    assert any(line.endswith("event loop: uvloop") for line in lines), lines  # the default


async def test_asyncio_loop_when_asked_for_serves_and_stops(
    tmp_path: Path, runs: list[Run]
) -> None:
    env = {**os.environ, "SEGTXN_EVENT_LOOP": "asyncio"}
    runs.append(run := Run(tmp_path, "standalone", "-v", "--port", "0", env=env))
    await wait_ready(await standalone_url(run), "standalone", START_S)
    run.signal(signal.SIGTERM)
    code, _, lines = await asyncio.to_thread(run.wait, STOP_S)
    assert code == 0, lines
    assert any(line.endswith("event loop: asyncio") for line in lines), lines
    assert "SIGTERM: stopping the servers" in lines


def test_auto_falls_back_to_asyncio_and_uvloop_must_be_installed_when_named() -> None:
    assert loops.choose("auto", uvloop_installed=False).name == "asyncio"
    assert loops.choose("auto", uvloop_installed=True).name == "uvloop"
    assert loops.choose("asyncio", uvloop_installed=True).name == "asyncio"
    with pytest.raises(click.BadParameter, match="uvloop is not installed"):
        loops.choose("uvloop", uvloop_installed=False)


class _Node:
    """Something start-up allocated."""

    def __init__(self) -> None:
        self.peer: _Node | None = None


def test_freeze_collects_start_up_garbage_before_freezing_the_rest() -> None:
    kept, garbage = _Node(), _Node()
    garbage.peer = garbage  # a cycle: only a collection frees it
    collected = weakref.ref(garbage)
    del garbage
    try:
        frozen = lifecycle.freeze_start_up()
        assert collected() is None, "start-up's garbage was frozen (leaked), not collected"
        assert frozen == gc.get_freeze_count() > 0
        in_reach = (o for generation in range(3) for o in gc.get_objects(generation))
        assert not any(o is kept for o in in_reach), "a live object is still examined"
    finally:
        gc.unfreeze()


async def test_sigint_while_serving_stops_a_broker_on_etcd(
    etcd_server: EtcdServer, tmp_path: Path, runs: list[Run]
) -> None:
    store = etcd_server.url(f"/lifecycle-{time.monotonic_ns()}")
    args = server_args("broker", store, tmp_path)
    runs.append(run := Run(tmp_path, *args))
    await wait_ready(await served_url(run), "broker", START_S)
    sent = run.signal(signal.SIGINT)
    code, _, lines = await asyncio.to_thread(run.wait, STOP_S)
    assert time.monotonic() - sent < STOP_S
    assert code == 0, lines
    assert "SIGINT: stopping the servers" in lines
    assert any(line.startswith("closed broker 127.0.0.1-") for line in lines), lines


async def test_a_shutdown_that_cannot_finish_ends_at_the_shutdown_timeout(
    tmp_path: Path, runs: list[Run]
) -> None:
    """Its etcd frozen, a broker cannot revoke its session: it gives up at the timeout."""
    etcd = EtcdServer.in_temp_dir(unsafe_no_fsync=True)
    etcd.start()
    try:
        args = server_args("broker", etcd.url("/t"), tmp_path, "--shutdown-timeout", "2")
        runs.append(run := Run(tmp_path, *args))
        await wait_ready(await served_url(run), "broker", START_S)
        assert etcd.process is not None
        etcd.process.send_signal(signal.SIGSTOP)
        try:
            sent = run.signal(signal.SIGTERM)
            code, _, lines = await asyncio.to_thread(run.wait, STOP_S)
            took = time.monotonic() - sent
        finally:
            etcd.process.send_signal(signal.SIGCONT)
    finally:
        etcd.stop()
    assert code == 1, lines
    assert 2 <= took < 2 + STOP_S / 2
    assert (
        lines[-1].startswith("Error: broker") and "within the shutdown timeout (2 s)" in lines[-1]
    )


async def test_a_second_signal_ends_a_stuck_shutdown_at_once(
    tmp_path: Path, runs: list[Run]
) -> None:
    etcd = EtcdServer.in_temp_dir(unsafe_no_fsync=True)
    etcd.start()
    try:
        args = server_args("broker", etcd.url("/t"), tmp_path, "--shutdown-timeout", "300")
        runs.append(run := Run(tmp_path, *args))
        await wait_ready(await served_url(run), "broker", START_S)
        assert etcd.process is not None
        etcd.process.send_signal(signal.SIGSTOP)
        try:
            run.signal(signal.SIGTERM)
            await wait_until(
                lambda: "SIGTERM: stopping the servers" in run.stderr_path.read_text(),
                timeout=STOP_S,
                what="the shutdown to begin",
            )
            sent = run.signal(signal.SIGINT)
            code, _, lines = await asyncio.to_thread(run.wait, STOP_S)
            took = time.monotonic() - sent
        finally:
            etcd.process.send_signal(signal.SIGCONT)
    finally:
        etcd.stop()
    assert code == 1, lines
    assert took < STOP_S / 2
    assert lines[-1] == "second SIGINT: exiting without finishing the shutdown", lines


def test_a_taken_port_is_one_line(tmp_path: Path, runs: list[Run]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        runs.append(run := Run(tmp_path, "standalone", "--port", str(port)))
        code, _, lines = run.wait(START_S)
    assert code == 1
    assert lines == [
        f"Error: broker standalone could not start: cannot listen on 127.0.0.1:{port}: "
        "address already in use"
    ]


SERVING = re.compile(r"^serving: (?P<what>.+?) on (?P<url>https?://\S+) \(", re.MULTILINE)


async def serving(run: Run, servers: int) -> dict[str, str]:
    """What each of ``servers`` servers of ``run`` says it serves as, and its URL, once all
    have said it."""

    def said() -> bool:
        if run.proc.poll() is not None:
            raise AssertionError(f"exited {run.proc.returncode}: {run.stderr_path.read_text()}")
        return len(SERVING.findall(run.stderr_path.read_text())) == servers

    await wait_until(said, timeout=START_S, what=f"{servers} 'serving:' lines")
    return {m["what"]: m["url"] for m in SERVING.finditer(run.stderr_path.read_text())}


async def served_url(run: Run) -> str:
    """The URL the one server of ``run`` (a broker or a coordinator) serves on."""
    [(_, url)] = (await serving(run, 1)).items()
    return url


async def standalone_url(run: Run) -> str:
    """The URL the broker of a standalone ``run`` serves on (its clients' URL)."""
    return (await serving(run, 2))["broker standalone"]


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def test_standalone_on_port_0_serves_on_the_ports_it_reports(
    tmp_path: Path, runs: list[Run]
) -> None:
    """Each listens on a port the system picks; the URLs printed and registered name them
    (the picks were held from the first: nothing could take them before the servers)."""
    runs.append(run := Run(tmp_path, "standalone", "--port", "0", "--coordinator-port", "0"))
    said = await serving(run, 2)
    broker, coordinator = said["broker standalone"], said["transaction coordinator"]
    assert 0 not in (_port(broker), _port(coordinator)), said
    assert _port(broker) != _port(coordinator), said
    await wait_ready(broker, "the broker", START_S)
    await wait_ready(coordinator, "the coordinator", START_S)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{broker}/lookup/v2/coordinators") as answer:
            assert await answer.json() == {"coordinators": [coordinator]}  # as registered
        async with Client(broker) as client:  # the coordinator is found through the store
            await client.admin.create_topic("persistent://acme/ports/t")
            async with http.get(f"{broker}/lookup/v2/topic/persistent/acme/ports/t") as answer:
                assert broker in await answer.text()  # the broker's URL, as registered
            txn = await client.transaction(timeout_s=60).start()
            await txn.commit()
            assert await txn.status() == "COMMITTED"
    run.signal(signal.SIGTERM)
    code, _, lines = await asyncio.to_thread(run.wait, STOP_S)
    assert code == 0, lines


@pytest.mark.parametrize("command", ["broker", "coordinator"])
async def test_a_server_advertising_port_0_advertises_the_port_it_got(
    command: str, tmp_path: Path, runs: list[Run]
) -> None:
    """``--advertise http://host:0``: listen on a port the system picks, and advertise it
    (it listened on port 80 and advertised port 0)."""
    runs.append(run := Run(tmp_path, *server_args(command, "memory://", tmp_path)))
    url = await served_url(run)
    assert _port(url) != 0, url
    await wait_ready(url, command, START_S)
    run.signal(signal.SIGTERM)
    code, _, lines = await asyncio.to_thread(run.wait, STOP_S)
    assert code == 0, lines


# ------------------------------------------------------------------ the operator


def test_the_operator_gives_up_on_a_dead_api_server(tmp_path: Path, runs: list[Run]) -> None:
    env = kubeconfig(tmp_path, free_port())
    runs.append(run := Run(tmp_path, "operator", "--standalone", "--api-timeout", "2", env=env))
    code, elapsed, lines = run.wait(START_S + 2)
    assert code == 1
    assert len(lines) == 1, lines
    assert lines[0].startswith("Error: cannot reach the Kubernetes API at http://127.0.0.1:")
    assert "within 2 s" in lines[0] and "connection refused" in lines[0]
    assert elapsed >= 2


def test_sigterm_stops_the_operator_during_start_up(
    tmp_path: Path, runs: list[Run], blackhole: Blackhole
) -> None:
    env = kubeconfig(tmp_path, blackhole.port)
    runs.append(run := Run(tmp_path, "operator", "--standalone", "--api-timeout", "300", env=env))
    asyncio.run(wait_until(blackhole.connected, timeout=START_S, what="the API connection"))
    sent = run.signal(signal.SIGTERM)
    code, _, lines = run.wait(STOP_S)
    assert time.monotonic() - sent < STOP_S
    assert code == 0, lines
    assert not any("Traceback" in line for line in lines), lines


async def test_a_data_dir_a_running_broker_holds_is_refused_until_it_is_gone(
    tmp_path: Path, runs: list[Run]
) -> None:
    """Two servers on one ``--data-dir`` (a second standalone pointed at the first one's,
    another store namespace) each opened the other's ledger files: every topic whose name
    met timed out ("... is held by another writer"), and once one stopped, the other was
    refused the ledgers it had written there. The directory is now held by the first, and
    freed by its end, a SIGKILL included."""
    data = tmp_path / "data"
    runs.append(first := Run(tmp_path, *server_args("broker", "memory://", tmp_path)))
    await served_url(first)
    second_args = server_args("broker", "memory://", tmp_path, "--broker-id", "other")
    runs.append(second := Run(tmp_path, *second_args))
    code, _, lines = await asyncio.to_thread(second.wait, START_S)
    assert code == 2, lines
    assert lines[-1] == (
        f"Error: Invalid value for '--data-dir': {data} is in use by another segtxn server "
        f"(pid {first.proc.pid}): give each broker a directory of its own "
        "(see 'segtxn broker --help')"
    ), lines
    first.kill()
    runs.append(third := Run(tmp_path, *second_args))
    await served_url(third)
