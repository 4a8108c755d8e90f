"""A broker's ``--data-dir`` is its own: held by one server process at a time.

Why: two servers pointed at one directory (a second standalone given the first one's
``--data-dir`` with another store namespace) each opened the other's ledger files. Nothing
was lost, since each ledger file is locked by its writer, but every topic whose name met
timed out ("... is held by another writer"), and once one of them stopped, the other was
refused the ledgers it had written there ("already holds data that the ledger metadata
does not know"). Refused at start-up instead, naming the process that holds it.

The hold is an ``flock`` on :data:`LOCK_FILE` in the directory, taken for as long as the
server runs: the kernel lets go of it when the process ends, a SIGKILL included, so a
crashed server never leaves its directory claimed. The file is left in place (removing it
would race with the next server taking it); it holds the last holder's pid, for the error.
Coordinators are not held: their ``--data-dir`` is one that every coordinator shares.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path

import click

from segtxn.cli.params import prepare_data_dir

LOCK_FILE = ".segtxn.lock"


def claim_data_dir(held: contextlib.ExitStack, path: Path) -> Path:
    """:func:`~segtxn.cli.params.prepare_data_dir`, then hold the directory for this process
    until ``held`` closes. Returns it resolved.

    On a filesystem that has no locks (``ENOLCK``, ``EOPNOTSUPP``) it goes on unheld,
    saying so on stderr: refusing would leave such a directory unusable.

    Raises:
        click.BadParameter: another process holds it (its pid named), or it cannot be used.
    """
    resolved = prepare_data_dir(path)
    lock = resolved / LOCK_FILE
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise click.BadParameter(
            f"{path} cannot be used: {lock}: {e.strerror or e}", param_hint="'--data-dir'"
        ) from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            os.close(fd)
            click.echo(f"warning: {path} is not held for this process: {e.strerror}", err=True)
            return resolved
        holder = _holder(fd)
        os.close(fd)
        raise click.BadParameter(
            f"{path} is in use by another segtxn server{holder}: give each broker a "
            "directory of its own",
            param_hint="'--data-dir'",
        ) from None
    held.callback(os.close, fd)  # closing the descriptor lets go of the lock
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return resolved


def _holder(fd: int) -> str:
    """`` (pid N)`` from the lock file, or nothing when it does not say (yet)."""
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return f" (pid {text})" if text.isdigit() else ""
