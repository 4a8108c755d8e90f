"""A server command run in the caller's process (a test's ``CliRunner``, an embedding
program) puts SIGINT's and SIGTERM's handlers back as it found them when it ends
(segtxn/cli/lifecycle.py, ``catch_signals_early``). Before, the handlers it installed
stayed: a later SIGINT or SIGTERM raised its ``Interrupted`` wherever the caller was.

The real commands, in-process; each ends on its own: a server's start-up refused (its port
taken), the operator's Kopf recorded instead of run.
"""

from __future__ import annotations

import importlib
import signal
import socket
from collections.abc import Callable, Iterator
from typing import Any

import kopf
import pytest
from click.testing import CliRunner

from segtxn.cli.commands import main

SIGNALS = (signal.SIGINT, signal.SIGTERM)
Handler = Callable[[int, Any], Any] | int | None


def _callers(signum: int, _frame: object) -> None:
    raise AssertionError(f"the caller's own handler of {signal.Signals(signum).name} ran")


@pytest.fixture
def handlers() -> Iterator[dict[signal.Signals, Handler]]:
    """The caller's own handlers (not Python's defaults, which asyncio's loop puts back
    after its own), installed for the test; pytest's are put back after it."""
    before = {sig: signal.signal(sig, _callers) for sig in SIGNALS}
    try:
        yield {sig: _callers for sig in SIGNALS}
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_a_server_command_puts_the_signal_handlers_back(
    handlers: dict[signal.Signals, Handler],
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = CliRunner().invoke(main, ["standalone", "--port", str(port)])
    assert done.exit_code == 1, done.output
    assert "could not start" in done.output, done.output
    assert {sig: signal.getsignal(sig) for sig in SIGNALS} == handlers


def test_the_operator_command_puts_the_signal_handlers_back(
    handlers: dict[signal.Signals, Handler], monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[dict[str, Any]] = []
    monkeypatch.setattr(kopf, "run", lambda **kwargs: runs.append(kwargs))
    module = importlib.import_module("segtxn.cli.operator")  # (not the command of that name)
    monkeypatch.setattr(module, "_quiet_start_up_failures", lambda: None)
    done = CliRunner().invoke(main, ["operator", "--standalone", "-n", "segtxn"], env={})
    assert done.exit_code == 0, done.output
    assert runs, "Kopf was not run"
    assert {sig: signal.getsignal(sig) for sig in SIGNALS} == handlers
