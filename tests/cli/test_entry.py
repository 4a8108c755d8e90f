"""The ``segtxn`` entry points (the console script, ``python -m segtxn.cli``) before any
command runs: a Ctrl-C while Python is still importing the commands (over a second on a
loaded machine) is one line and exit status 130, never a traceback, also in a process
started with SIGINT ignored (a script's background job).

The SIGINT lands mid-import on purpose: a ``sitecustomize`` put on the child's path holds
the first import of ``click`` (which only the commands import) until the test has sent it.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

HOLD_CLICK = """
import importlib.abc
import os
import signal
import sys


class HoldClick(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "click":
            sys.meta_path.remove(self)
            os.write(int(os.environ["SEGTXN_TEST_IMPORTING_FD"]), b"importing")
            signal.pause()  # until the test's SIGINT; its KeyboardInterrupt leaves from here
        return None


sys.meta_path.insert(0, HoldClick())
"""

IMPORT_WAIT_S = 60
"""How long the child may take to reach the commands' imports on a loaded machine."""


def _console_script() -> list[str]:
    """What the installed ``segtxn`` script runs: pyproject.toml's entry point, called."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, function = scripts["segtxn"].split(":")
    return ["-c", f"import sys; from {module} import {function}; sys.exit({function}())"]


def _interrupt_while_importing(
    entry: list[str], tmp_path: Path, *, started_ignoring_sigint: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run ``segtxn --help`` through ``entry``, SIGINT it while it imports the commands, and
    return how it ended."""
    (tmp_path / "sitecustomize.py").write_text(HOLD_CLICK)
    importing, told = os.pipe()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "SEGTXN_TEST_IMPORTING_FD": str(told),
    }
    argv = [sys.executable, *entry, "--help"]
    if started_ignoring_sigint:  # what a shell gives a script's `segtxn ... &`
        argv = ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *argv]
    command = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        pass_fds=(told,),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(told)
    try:
        ready, _, _ = select.select([importing], [], [], IMPORT_WAIT_S)
        assert ready and os.read(importing, 16) == b"importing", "the import was not held"
        command.send_signal(signal.SIGINT)
        out, err = command.communicate(timeout=IMPORT_WAIT_S)
    finally:
        os.close(importing)
        if command.poll() is None:
            command.kill()
            command.communicate()
    return subprocess.CompletedProcess(command.args, command.returncode, out, err)


@pytest.mark.parametrize(
    "entry", [_console_script(), ["-m", "segtxn.cli"]], ids=["console-script", "python-m"]
)
def test_ctrl_c_while_importing_the_commands_is_one_line(entry: list[str], tmp_path: Path) -> None:
    """Before, the KeyboardInterrupt left the import as a traceback and the process died
    of the signal (status -2)."""
    ended = _interrupt_while_importing(entry, tmp_path)
    assert "Traceback" not in ended.stderr, ended.stderr
    assert ended.stderr == "Error: interrupted\n"
    assert ended.stdout == ""
    assert ended.returncode == 130


def test_sigint_while_importing_interrupts_a_process_started_ignoring_it(
    tmp_path: Path,
) -> None:
    """A script's background job (``segtxn produce ... &``) starts with SIGINT ignored; a
    ``kill -INT`` in its first second, while the commands were still imported, was lost
    (the handler came later), and ``produce`` then sent all its ``-n`` and exited 0. The
    README promises 130 "also while the command is still starting"."""
    ended = _interrupt_while_importing(["-m", "segtxn.cli"], tmp_path, started_ignoring_sigint=True)
    assert ended.stderr == "Error: interrupted\n"
    assert ended.stdout == ""
    assert ended.returncode == 130
