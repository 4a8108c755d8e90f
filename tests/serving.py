"""The URL a ``segtxn`` server process started on port 0 serves on, read from its log.

A test that starts a server on a port it picked itself (``free_port()``: bind a socket, close
it) races every other process on the machine: one can bind the port before the server does,
which then fails to start (address already in use). Started on port 0 (``--port 0``, or an
advertised port 0), the server binds a port the system picks and holds it from then on, and
names it on its ``serving:`` line; these read it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from segtxn.verify.processes import READY_LIMIT_S, serving_port
from tests.waiting import wait_until


async def serving_url(
    log: Path, proc: subprocess.Popen[bytes], name: str, limit_s: float = READY_LIMIT_S
) -> str:
    """``http://127.0.0.1:<port>`` of the first ``serving:`` line ``proc`` wrote to ``log``
    (its stderr; a standalone names its broker first); fails if it exits first or says
    nothing within ``limit_s``."""

    def said() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"{name} exited {proc.returncode}: {_text(log)[-2000:]}")
        return serving_port(_text(log)) is not None

    await wait_until(said, timeout=limit_s, what=f"{name}'s 'serving:' line in {log}")
    return f"http://127.0.0.1:{serving_port(_text(log))}"


def _text(log: Path) -> str:
    return log.read_text(errors="replace") if log.exists() else ""
