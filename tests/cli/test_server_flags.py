"""`segtxn broker` and `segtxn standalone` flags become the settings the servers get."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner

from segtxn.broker.settings import BrokerSettings
from segtxn.broker.txn.headers import HeaderWatch
from segtxn.cli import servers
from segtxn.cli.commands import main
from segtxn.cli.loops import EventLoop
from segtxn.connlimits import ConnectionLimits
from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.ledger import RetentionPolicy
from segtxn.ledger.replicas import RepairSettings
from segtxn.web import Listener

BROKER = ["broker", "--store", "memory://", "--advertise", "http://127.0.0.1:9"]


@pytest.fixture
def loops_run_on() -> list[str]:
    """The event loop each command would have served on."""
    return []


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch, loops_run_on: list[str]) -> list[BrokerSettings]:
    """The broker settings a command would serve with (nothing is started)."""
    captured: list[BrokerSettings] = []

    class Broker:
        def __init__(self, settings: BrokerSettings, **_: Any) -> None:
            captured.append(settings)
            self.service = SimpleNamespace(store=None)  # standalone shares it

    def run(make: Callable[[], list[Any]], _shutdown_timeout_s: float, loop: EventLoop) -> None:
        loops_run_on.append(loop.name)
        make()

    monkeypatch.setattr(servers, "BrokerServer", Broker)
    monkeypatch.setattr(servers, "CoordinatorServer", lambda *_, **__: None)
    monkeypatch.setattr(servers, "_run", run)
    return captured


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.mark.parametrize("command", ["broker", "coordinator", "standalone"])
def test_event_loop_flag_and_variable(
    command: str,
    started: list[BrokerSettings],
    loops_run_on: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base = {
        "broker": [*BROKER, "--data-dir", str(tmp_path)],
        "coordinator": ["coordinator", "--store", "memory://", "--advertise", "http://h:1"],
        "standalone": ["standalone"],
    }[command]
    assert invoke(*base)[0] == 0
    assert invoke(*base, "--event-loop", "asyncio")[0] == 0
    monkeypatch.setenv("SEGTXN_EVENT_LOOP", "asyncio")
    assert invoke(*base)[0] == 0
    assert invoke(*base, "--event-loop", "uvloop")[0] == 0  # the flag wins over the variable
    assert loops_run_on == ["uvloop", "asyncio", "asyncio", "uvloop"]
    code, out = invoke(*base, "--event-loop", "trio")
    assert code == 2
    assert "'trio' is not one of 'auto', 'uvloop', 'asyncio'" in out


@pytest.mark.parametrize("command", ["broker", "standalone"])
def test_retention_defaults_and_flags(
    command: str, started: list[BrokerSettings], tmp_path: Path
) -> None:
    base = [*BROKER, "--data-dir", str(tmp_path)] if command == "broker" else ["standalone"]
    assert invoke(*base)[0] == 0
    assert started[-1].retention == RetentionPolicy(7 * 24 * 3600, -1)
    code, out = invoke(*base, "--retention-time", "0", "--retention-size", "1048576")
    assert code == 0, out
    assert started[-1].retention == RetentionPolicy(retention_time_s=0, retention_bytes=1 << 20)
    assert invoke(*base, "--retention-time", "-1", "--retention-size", "-1")[0] == 0
    assert started[-1].retention == RetentionPolicy(-1, -1)


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        (["--retention-time", "-2"], "'--retention-time': must be -1 (no limit) or >= 0"),
        (["--retention-time", "-0.5"], "'--retention-time': must be -1 (no limit) or >= 0"),
        (["--retention-time", "inf"], "'--retention-time': must be -1 (no limit) or >= 0"),
        (["--retention-time", "week"], "'week' is not a valid float"),
        (["--retention-size", "-5"], "'--retention-size': must be -1 (no limit) or >= 0"),
        (["--retention-size", "1.5"], "'1.5' is not a valid integer"),
        (["--retention-size", "10G"], "'10G' is not a valid integer"),
    ],
)
def test_bad_retention_values_are_usage_errors(
    flags: list[str], complaint: str, started: list[BrokerSettings], tmp_path: Path
) -> None:
    for base in ([*BROKER, "--data-dir", str(tmp_path)], ["standalone"]):
        code, out = invoke(*base, *flags)
        assert code == 2 and complaint in out, out  # click's UsageError
    assert not started


REPLICATED = [*BROKER, "--replication", "3/2"]


def test_repair_defaults_and_flags(started: list[BrokerSettings], tmp_path: Path) -> None:
    base = [*REPLICATED, "--data-dir", str(tmp_path)]
    assert invoke(*base)[0] == 0
    assert started[-1].repair == RepairSettings()
    code, out = invoke(
        *base,
        "--repair-interval", "2.5",
        "--repair-full-interval", "60",
        "--repair-members-interval", "1",
        "--repair-lost-after", "0",
        "--repair-max-copies", "4",
        "--replica-sweep-interval", "120",
        "--replica-sweep-grace", "7200",
    )  # fmt: skip
    assert code == 0, out
    assert started[-1].repair == RepairSettings(
        check_s=2.5,
        full_check_s=60,
        members_check_s=1,
        lost_after_s=0,
        max_copies=4,
        sweep_s=120,
        sweep_grace_s=7200,
    )


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        (["--repair-interval", "0"], "'--repair-interval': 0.0 is not in the range 0<x"),
        (["--repair-interval", "soon"], "'soon' is not a valid float"),
        (["--repair-lost-after", "-1"], "'--repair-lost-after': -1.0 is not in the range"),
        (["--repair-max-copies", "0"], "'--repair-max-copies': 0 is not in the range x>=1"),
        (["--replica-sweep-grace", "0"], "'--replica-sweep-grace': 0.0 is not in the range"),
    ],
)
def test_bad_repair_values_are_usage_errors(
    flags: list[str], complaint: str, started: list[BrokerSettings], tmp_path: Path
) -> None:
    code, out = invoke(*REPLICATED, "--data-dir", str(tmp_path), *flags)
    assert code == 2 and complaint in out, out
    assert not started


def test_repair_flags_need_replication(started: list[BrokerSettings], tmp_path: Path) -> None:
    code, out = invoke(*BROKER, "--data-dir", str(tmp_path), "--repair-interval", "5")
    assert code == 2
    assert "--repair-interval does not apply here: it needs --replication" in out
    assert not started
    assert invoke(*BROKER, "--data-dir", str(tmp_path))[0] == 0  # the defaults: fine


def test_the_coordinator_takes_the_repair_flags_of_its_loop(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    captured: list[CoordinatorSettings] = []

    def coordinator(settings: CoordinatorSettings, **_: Any) -> None:
        captured.append(settings)

    monkeypatch.setattr(servers, "CoordinatorServer", coordinator)
    monkeypatch.setattr(servers, "_run", lambda make, _timeout, _loop: make())
    base = ["coordinator", "--store", "memory://", "--advertise", "http://127.0.0.1:9"]
    flags = ["--repair-interval", "3", "--repair-lost-after", "60"]
    code, out = invoke(*base, "--replication", "3/2", *flags)
    assert code == 0, out
    assert captured[-1].repair == RepairSettings(check_s=3, lost_after_s=60)
    code, out = invoke(*base, "--replication", "3/2", "--replica-sweep-interval", "5")
    assert code == 2 and "No such option '--replica-sweep-interval'" in out  # no node to sweep
    code, out = invoke(*base, "--data-dir", str(tmp_path), *flags)
    assert code == 2 and "it needs --replication" in out


def test_header_watch_default_and_flag(started: list[BrokerSettings], tmp_path: Path) -> None:
    base = [*BROKER, "--data-dir", str(tmp_path)]
    assert invoke(*base)[0] == 0
    default = started[-1]
    assert default.header_watch is HeaderWatch.PREFIX
    code, out = invoke(*base, "--header-watch", "scoped")
    assert code == 0, out
    scoped = started[-1]
    assert scoped.header_watch is HeaderWatch.SCOPED
    code, out = invoke(*base, "--header-watch", "everything")
    assert code == 2 and "'everything' is not one of 'prefix', 'scoped'" in out


@pytest.mark.parametrize("command", ["broker", "standalone"])
def test_publish_buffer_default_and_flag(
    command: str, started: list[BrokerSettings], tmp_path: Path
) -> None:
    base = [*BROKER, "--data-dir", str(tmp_path)] if command == "broker" else ["standalone"]
    assert invoke(*base)[0] == 0
    assert started[-1].max_publish_buffer_bytes == 256 * 1024 * 1024
    code, out = invoke(*base, "--publish-buffer-size", str(64 << 20))
    assert code == 0, out
    assert started[-1].max_publish_buffer_bytes == 64 << 20
    largest = started[-1].max_message_bytes
    code, out = invoke(*base, "--publish-buffer-size", str(largest - 1))
    assert code == 2, out  # one usage line, no traceback
    assert f"--publish-buffer-size: {largest - 1} bytes) must hold the largest message" in out
    assert len(out.strip().splitlines()) == 1, out
    assert "Traceback" not in out
    code, out = invoke(*base, "--publish-buffer-size", "0")
    assert code == 2 and "0 is not in the range x>=1" in out, out
    assert len(started) == 2


@pytest.mark.parametrize("command", ["broker", "coordinator", "standalone"])
def test_connection_limits_default_and_flags(
    command: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each server of the command gets them (the coordinator of a standalone too)."""
    given: list[ConnectionLimits] = []

    def server(settings: BrokerSettings | CoordinatorSettings, **_: Any) -> SimpleNamespace:
        given.append(settings.connections)
        return SimpleNamespace(service=SimpleNamespace(store=None))

    monkeypatch.setattr(servers, "BrokerServer", server)
    monkeypatch.setattr(servers, "CoordinatorServer", server)
    monkeypatch.setattr(servers, "_run", lambda make, _timeout, _loop: make())
    base = {
        "broker": [*BROKER, "--data-dir", str(tmp_path)],
        "coordinator": ["coordinator", "--store", "memory://", "--advertise", "http://127.0.0.1:9"],
        "standalone": ["standalone"],
    }[command]
    servers_per_run = 2 if command == "standalone" else 1
    assert invoke(*base)[0] == 0
    assert given == [ConnectionLimits(None, None, 75.0)] * servers_per_run
    flags = ["--max-connections", "500", "--max-connections-per-ip", "20", "--idle-timeout", "9"]
    code, out = invoke(*base, *flags)
    assert code == 0, out
    assert given[servers_per_run:] == [ConnectionLimits(500, 20, 9.0)] * servers_per_run
    for bad, why in (
        (["--max-connections", "-1"], "-1 is not in the range x>=0"),
        (["--max-connections-per-ip", "many"], "'many' is not a valid integer"),
        (["--idle-timeout", "0"], "0.0 is not in the range 0<x"),
    ):
        code, out = invoke(*base, *bad)
        assert code == 2 and why in out, out
    assert len(given) == 2 * servers_per_run


class _ReusingSocket(socket.socket):
    """A socket whose bind to port 0 gets the port the last closed one had, as the system
    may hand out a port released a moment ago."""

    released: ClassVar[list[int]] = []

    def bind(self, address: Any) -> None:
        host, port = address
        if port == 0 and _ReusingSocket.released:
            port = _ReusingSocket.released.pop()
        super().bind((host, port))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            _ReusingSocket.released.append(self.getsockname()[1])
        super().close()


@pytest.mark.parametrize("explicit", [None, "--port", "--coordinator-port"])
def test_standalone_picks_free_ports_that_do_not_collide(
    started: list[BrokerSettings], monkeypatch: pytest.MonkeyPatch, explicit: str | None
) -> None:
    """``--port 0`` and ``--coordinator-port`` 0 (or left out) picked a free port each, one
    after the other, each released before the next was picked: the system could hand the
    broker's out again for the coordinator, which then failed to start (the address in
    use). Both are now picked while the other is still held, and a picked one is never a
    port given explicitly."""
    coordinators: list[CoordinatorSettings] = []
    monkeypatch.setattr(
        servers, "CoordinatorServer", lambda settings, **_: coordinators.append(settings)
    )
    monkeypatch.setattr(socket, "socket", _ReusingSocket)
    with socket.socket() as taken:  # a port given explicitly: free now, not yet listened on
        taken.bind(("127.0.0.1", 0))
        given = str(taken.getsockname()[1])
    _ReusingSocket.released[:] = [int(given)]  # the next pick would get it
    ports = {"--port": "0", "--coordinator-port": "0"}
    if explicit is not None:
        ports[explicit] = given
    code, out = invoke("standalone", *(a for flag in ports.items() for a in flag))
    assert code == 0, out
    broker = int(started[-1].advertise_url.rsplit(":", 1)[1])
    coordinator = int(coordinators[-1].advertise_url.rsplit(":", 1)[1])
    assert broker != coordinator, (broker, coordinator)
    if explicit is not None:
        assert (broker if explicit == "--port" else coordinator) == int(given)


def _taken_by_another_socket(url: str) -> bool:
    """Whether a socket of someone else's could bind the port ``url`` names, now."""
    with socket.socket() as intruder:
        try:
            intruder.bind(("127.0.0.1", int(url.rsplit(":", 1)[1])))
        except OSError:
            return False
        return True


HERE = ["--host", "127.0.0.1"]
ZERO = ["--advertise", "http://127.0.0.1:0", *HERE]
BROKER_0 = ["broker", "--store", "memory://", "--data-dir", "{tmp}", *ZERO]
COORDINATOR_0 = ["coordinator", "--store", "memory://", *ZERO]


@pytest.mark.parametrize(
    "args",
    [
        ["standalone", "--port", "0", "--coordinator-port", "0", *HERE],
        ["standalone", "--port", "0", *HERE],
        BROKER_0,
        [*BROKER_0, "--port", "0"],
        COORDINATOR_0,
        [*COORDINATOR_0, "--port", "0"],
    ],
    ids=" ".join,
)
def test_port_0_is_held_from_its_pick_until_the_server_serves_on_it(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Port 0 (``--port 0``, standalone's ``--coordinator-port``, an advertised port 0) once
    meant a port picked by binding a socket and closing it again, and the servers bound it
    a moment later: another process could take it meanwhile, and the server failed to
    start (address in use). Here another socket tries to take each advertised port between
    the pick and the servers' start: it cannot, the port is held by the listener the
    server is given to serve on, and the URL advertised names it (not port 0)."""
    made: list[tuple[str, Listener | None]] = []  # (advertised URL, listener)
    taken: list[str] = []

    class Server:
        def __init__(self, settings: Any, *, listener: Listener | None, **_: Any) -> None:
            made.append((settings.advertise_url, listener))
            self.service = SimpleNamespace(store=None)  # standalone shares it

    def run(make: Callable[[], list[Any]], *_: Any) -> None:  # where the servers would start
        make()
        taken.extend(url for url, _ in made if _taken_by_another_socket(url))

    monkeypatch.setattr(servers, "BrokerServer", Server)
    monkeypatch.setattr(servers, "CoordinatorServer", Server)
    monkeypatch.setattr(servers, "_run", run)
    code, out = invoke(*(a.replace("{tmp}", str(tmp_path)) for a in args))
    assert code == 0, out
    assert len(made) == (2 if args[0] == "standalone" else 1), made
    for url, listener in made:
        assert listener is not None and url == f"http://127.0.0.1:{listener.port}", made
    assert taken == [], f"another socket could take the port of {taken}"
