"""The processes the suite starts reuse compiled bytecode (tests/conftest.py).

Without it, under ``PYTHONDONTWRITEBYTECODE`` each server, CLI run or soak process of a
fresh checkout compiled every segtxn module from source again."""

from __future__ import annotations

import subprocess
import sys


def test_a_child_process_writes_and_reads_cached_bytecode() -> None:
    shown = subprocess.run(
        [sys.executable, "-c", "import sys; print(sys.dont_write_bytecode)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert shown == "False"


def test_this_process_writes_cached_bytecode_too() -> None:
    assert not sys.dont_write_bytecode
