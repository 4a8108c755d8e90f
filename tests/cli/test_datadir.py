"""A broker's ``--data-dir`` held by one process at a time (:mod:`segtxn.cli.datadir`); the
refusal of a second server on a running one's directory, through real processes, is in
``test_server_lifecycle.py``."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path

import click
import pytest

from segtxn.cli.datadir import LOCK_FILE, claim_data_dir


def test_a_held_directory_is_refused_naming_its_holder_and_free_once_let_go(
    tmp_path: Path,
) -> None:
    with contextlib.ExitStack() as first:
        assert claim_data_dir(first, tmp_path / "d") == (tmp_path / "d").resolve()
        assert (tmp_path / "d" / LOCK_FILE).read_text() == f"{os.getpid()}\n"
        with pytest.raises(click.BadParameter) as refused, contextlib.ExitStack() as second:
            claim_data_dir(second, tmp_path / "d")
        assert f"is in use by another segtxn server (pid {os.getpid()})" in str(refused.value)
    with contextlib.ExitStack() as again:  # the first let go: a left lock file holds nothing
        claim_data_dir(again, tmp_path / "d")


def test_a_filesystem_without_locks_serves_unheld_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with contextlib.ExitStack() as held:
        assert claim_data_dir(held, tmp_path) == tmp_path.resolve()
    assert f"warning: {tmp_path} is not held for this process: " in capsys.readouterr().err
