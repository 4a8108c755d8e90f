"""The ``segtxn`` command line: the composition root that wires components together.

The project's first design placed the command line in ``segtxn/client/``; it lives here
instead because commands such as ``standalone`` and ``broker`` must import the servers, and
the client package must never import a server (an import-linter contract checks both; see
docs/design-notes.md). The commands are in :mod:`segtxn.cli.commands`.

This module is the process's entry point (the ``segtxn`` console script and
``python -m segtxn.cli``) and imports nothing heavy: the commands' imports (aiohttp, gRPC,
OpenTelemetry, the servers) take over a second on a loaded machine, and a Ctrl-C in that
time used to leave the import as a KeyboardInterrupt traceback, the process killed by the
signal. :func:`main` makes it the one line and the exit status of any other interrupt,
also in a process started with SIGINT ignored (a script's ``segtxn produce ... &``), where
a SIGINT in that second used to be lost and the command then ran to its end.
"""

from __future__ import annotations

import signal
import sys

INTERRUPTED = 130
"""The exit status of a command stopped by SIGINT (Ctrl-C): 128 + the signal's number."""


def main() -> None:
    """Run the ``segtxn`` command with ``sys.argv``; exit with its status."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        # Python installs no handler then; the commands' edge would, after the imports
        # (segtxn.cli.errors.interruptible), and a SIGINT before it would be lost.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        from segtxn.cli.commands import main as command

        command()
    except KeyboardInterrupt:  # before the command's own edge could take it
        sys.stderr.write("Error: interrupted\n")
        sys.exit(INTERRUPTED)
