"""The command line's edge: every failure becomes one line on stderr and a non-zero exit.

The commands raise typed errors (the client's, the store's, the servers' start-up errors,
click's usage errors); :class:`Main` turns each into one line, ``Error: ...``, here and
nowhere else. Exit status: 2 for a usage error (a bad flag or argument), 1 for any other
failure, 130 for Ctrl-C (SIGINT), 143 for SIGTERM (both stop a command alike:
:func:`interruptible`). A command that fails part-way (``produce``, ``consume``) says how
far it got first (:class:`FailedPartWay`). An error nobody expected is an internal error:
one line saying so, and its traceback with ``-vv`` (never without: a user reads the line, a
developer asks for the traceback). Connection failures are said in words (``connection
refused``, ``the host name does not resolve``), with the URL that could not be reached,
never as an aiohttp object's repr.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any, NoReturn

import aiohttp
import click

from segtxn.cli import INTERRUPTED, verbosity
from segtxn.client import (
    CertificateError,
    ClientError,
    ConnectionLost,
    ErrorCategory,
    ServerError,
    ServiceNotReady,
    Timeout,
)
from segtxn.client.unreachable import why_unreachable
from segtxn.metastore import MetadataStoreError


class ServeError(Exception):
    """A server command could not run as asked (the message is the one line to print; the
    server commands raise it, :mod:`segtxn.cli.lifecycle`; defined here, like
    :class:`Interrupted`)."""


class Interrupted(BaseException):
    """SIGTERM or SIGINT arrived before a server's own handlers were in place (see
    :func:`.lifecycle.catch_signals_early`, which raises it). A BaseException, like
    KeyboardInterrupt: nothing on the way out mistakes it for a failure; the CLI's edge ends
    the process with status 0. Defined here, where it is caught, so that the edge need not
    import the servers."""

    def __init__(self, sig: signal.Signals) -> None:
        super().__init__(sig.name)
        self.signal = sig


class ServiceUnreachable(Exception):
    """A command could not connect to the cluster; the message names the URL and why."""


class FailedPartWay(Exception):
    """A command failed after it had done part of its work (``raise FailedPartWay(done)
    from error``): its one line says how far it got, as Ctrl-C's does, then the error,
    ``Error: failed (10 of 20 messages stored): Timeout: ...``."""

    def __init__(self, done: str) -> None:
        super().__init__(done)
        self.done = done


def causes(e: BaseException) -> Iterator[BaseException]:
    """``e`` and what caused it (``__cause__``, ``__context__``, ``last_error``), in order."""
    seen: set[int] = set()
    current: BaseException | None = e
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__ or getattr(current, "last_error", None)


def unreachable(e: BaseException) -> tuple[str, str] | None:
    """``(host:port, why)`` when ``e`` comes from a connection that could not be made (not
    a TLS failure: the client's CertificateError already says what was wrong with it; nor
    a request whose answer was lost, :func:`answer_lost`, though reaching its broker again
    then failed so: its own message says it may have been done, which "cannot reach"
    would not)."""
    if isinstance(e, CertificateError) or answer_lost(e):
        return None
    for cause in causes(e):
        if isinstance(cause, aiohttp.ClientConnectorError):
            return f"{cause.host}:{cause.port}", why_unreachable(cause)
    return None


def answer_lost(e: BaseException) -> bool:
    """A request went out and its answer never came, so it may or may not have been done:
    a Timeout or a ConnectionLost (a send or an acknowledgment written, whose broker could
    then not be reached again) whose outcome is unknown, or a ServiceNotReady from a
    connection that broke after it was made (one refused or never made sent nothing)."""
    if isinstance(e, Timeout | ConnectionLost):
        return e.category is ErrorCategory.OUTCOME_UNKNOWN
    if isinstance(e, ServiceNotReady):
        return any(
            isinstance(cause, aiohttp.ClientConnectionError)
            and not isinstance(cause, aiohttp.ClientConnectorError)
            for cause in causes(e)
        )
    return False


_CONNECTOR_REPR = re.compile(
    r"ClientConnector\w*Error\(ConnectionKey\([^()]*\), (?P<kind>\w+)\((?P<code>-?\d+), "
    r"(?:'[^']*'|\"[^\"]*\")\)\)"
)
"""aiohttp's repr of a connection that could not be made, as the client's messages embed it
(a list of failed service URLs carries no cause to read it from)."""


def _connector_repr_in_words(match: re.Match[str]) -> str:
    code = int(match["code"])
    if match["kind"] == "gaierror":
        return "the host name does not resolve"
    if code == errno.ECONNREFUSED:
        return "connection refused"
    return os.strerror(code).lower() if code > 0 else match["kind"]


def in_words(message: str) -> str:
    """``message`` with any connection-error repr in it replaced by words."""
    return _CONNECTOR_REPR.sub(_connector_repr_in_words, message)


def _in_words(message: str, e: BaseException) -> str:
    """``message`` with the reprs of ``e``'s causes (``ClientConnectorError(Connection
    Key(...))``), and any other connection-error repr in it, replaced by words."""
    for cause in causes(e):
        if cause is not e:
            message = message.replace(repr(cause), why_unreachable(cause))
    return in_words(message)


def describe(e: BaseException) -> str | None:
    """The one line for an error a user can meet; None for an unexpected one (a bug)."""
    if isinstance(e, ExceptionGroup) and e.exceptions:  # a task group's: its first error
        return describe(e.exceptions[0])
    if isinstance(e, ServeError | ServiceUnreachable):
        return str(e)
    if isinstance(e, ServerError):
        return f"{e.name.value}: {_in_words(e.message, e)}"
    if isinstance(e, ClientError):
        return f"{type(e).__name__}: {_in_words(str(e), e)}"
    if isinstance(e, MetadataStoreError):
        return f"metadata store: {type(e).__name__}: {e}"
    if isinstance(e, aiohttp.ClientConnectorError):
        return f"cannot reach {e.host}:{e.port}: {why_unreachable(e)}"
    if isinstance(e, aiohttp.InvalidURL):
        return f"not a URL segtxn can use: {e}"
    if isinstance(e, aiohttp.ClientError):
        return f"connection failed: {why_unreachable(e)}"
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename is not None else e.strerror
    return None


def fail(message: str, code: int = 1) -> NoReturn:
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)


TERMINATED = 143
"""The exit status of a command stopped by SIGTERM: 128 + the signal's number."""


@dataclass
class _Stop:
    """Which signal the KeyboardInterrupt a command stops on stands for: SIGINT, unless a
    SIGTERM came (:func:`interruptible`)."""

    signal: signal.Signals = signal.SIGINT


_stop = _Stop()


def _terminate_as_interrupt(_signum: int, frame: FrameType | None) -> None:
    """SIGTERM's handler within :func:`interruptible`: noted, then handled by whatever
    handles SIGINT at that moment, so that it stops the command exactly as Ctrl-C does.
    Within ``asyncio.run`` that is asyncio's handler: it cancels the command's main task
    (the client closes, the command's ``finally`` runs) and raises KeyboardInterrupt once
    the task has ended; a second signal raises it at once. Elsewhere it is Python's, which
    raises it at once."""
    _stop.signal = signal.SIGTERM
    on_sigint = signal.getsignal(signal.SIGINT)
    if not callable(on_sigint):  # SIG_DFL, set by an in-process caller
        on_sigint = signal.default_int_handler
    on_sigint(signal.SIGINT, frame)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Within it SIGINT raises KeyboardInterrupt (what ``asyncio.run`` turns into a cancel
    of the command's body), also in a process started with SIGINT ignored; and SIGTERM
    does what SIGINT does, the command's edge then saying ``terminated`` instead of
    ``interrupted`` and exiting with status 143 (:func:`interrupted`).

    Why SIGINT: a shell script's background job (``segtxn produce ... &``; a test suite run
    so) starts with SIGINT ignored (POSIX, without job control), and Python then installs no
    handler: ``kill -INT`` did nothing, and ``produce`` went on sending until its ``-n``
    was done instead of saying how far it got. The servers take SIGINT on their own loop
    whatever they inherited (:mod:`segtxn.cli.lifecycle`); this makes every command alike.
    Why SIGTERM: it is how a supervisor stops a process (``kubectl delete``, systemd,
    ``docker stop``), and Python's default killed ``produce`` or ``consume`` on the spot,
    saying nothing of what it had stored or acknowledged. A SIGTERM the process inherited
    ignored, or that a caller in the same process handles, is left as it is; the server
    commands install their own handlers within (:func:`.lifecycle.catch_signals_early`),
    and their stop is unchanged.

    Each disposition changed here is put back on the way out (a caller in the same
    process, such as a test's ``CliRunner``, keeps its own). Only the main thread can set
    a signal handler: elsewhere this does nothing.
    """
    _stop.signal = signal.SIGINT
    main_thread = threading.current_thread() is threading.main_thread()
    ignored = main_thread and signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    terminable = main_thread and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if terminable:
        signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    try:
        yield
    finally:
        if terminable:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def interrupted(done: str = "") -> NoReturn:
    """End a command that SIGINT or SIGTERM stopped: ``Error: interrupted`` (SIGINT, exit
    status 130) or ``Error: terminated`` (SIGTERM, 143), followed by ``done`` (how far it
    got) when given."""
    if _stop.signal is signal.SIGTERM:
        said, code = "terminated", TERMINATED
    else:
        said, code = "interrupted", INTERRUPTED
    fail(f"{said}: {done}" if done else said, code)


class Main(click.Group):
    """The ``segtxn`` group: runs a command and reports any failure in one line; SIGINT
    interrupts it (exit status 130) even when the process was started ignoring SIGINT, and
    SIGTERM alike (exit status 143; :func:`interruptible`)."""

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; SIGINT or SIGTERM while it runs ends the process here, with its
        one line (:func:`interrupted`).

        Why here: click's own handler of a KeyboardInterrupt writes an empty line first (to
        end the line a terminal's ``^C`` echo leaves), and then the one line came after an
        empty one, in a pipe or a log as well. An interrupt while click still parses the
        arguments (before this runs) still goes through click's handler; it is over in
        milliseconds."""
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            interrupted()

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        verbosity.reset()
        try:
            with interruptible():
                code = super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.NoArgsIsHelpError as e:  # `segtxn`, `segtxn topics`: no error
            click.echo(e.ctx.get_help() if e.ctx is not None else e.format_message())
            sys.exit(0)
        except click.UsageError as e:
            where = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
            fail(f"{e.format_message()}{where}", e.exit_code)
        except click.ClickException as e:
            fail(e.format_message(), e.exit_code)
        except Interrupted as e:  # a server asked to stop before it served: a clean stop
            click.echo(f"{e.signal.name} while starting: stopped", err=True)
            sys.exit(0)
        except (click.Abort, KeyboardInterrupt):
            interrupted()
        except BrokenPipeError:  # `segtxn ... | head`: the reader left; nothing to say
            os._exit(1)
        except Exception as e:
            done = ""
            error: BaseException = e
            if isinstance(e, FailedPartWay) and e.__cause__ is not None:
                done, error = f"failed ({e.done}): ", e.__cause__
            debug = verbosity.configured() >= 2
            if debug:
                traceback.print_exception(error)
            line = describe(error)
            if line is None:
                hint = "" if debug else " (segtxn -vv ... shows the traceback)"
                line = f"internal error: {type(error).__name__}: {error}{hint}"
            fail(done + line)
        sys.exit(code if isinstance(code, int) else 0)
