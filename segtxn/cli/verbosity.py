"""``-v`` / ``-vv``: this process's logging, and what the processes it starts are given.

``segtxn -v COMMAND`` logs INFO, ``-vv`` DEBUG, to the terminal (default: warnings);
``segtxn COMMAND -v`` too (every subcommand accepts the flag and adds it to the count). The
commands that start processes (``demo``, ``verify soak``) pass the verbosity down, as ``-v``
or ``-vv`` before the subcommand, to every server and processor; those log into their files
in the run's ``logs/`` directory, and at least at INFO (a run's logs must be enough to
diagnose it), while the terminal stays as quiet as asked.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import click

from segtxn.cli.lazy import LazyGroup
from segtxn.verify.processes import Launch

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


QUIET = ("py4j",)
"""Libraries whose INFO and DEBUG are noise here (py4j logs every call to Spark's JVM)."""


_configured = 0


def reset() -> None:
    """Forget the ``-v`` count of a previous command (tests run many in one process)."""
    global _configured  # noqa: PLW0603 (the edge reads it after the command's context is gone)
    _configured = 0


def configured() -> int:
    """The ``-v`` count of the command that ran last (0 if it failed before parsing it)."""
    return _configured


def configure(verbose: int) -> None:
    """Log at WARNING, INFO (1) or DEBUG (2+) to the terminal; again with a higher count
    when a subcommand's ``-v`` adds to it."""
    global _configured  # noqa: PLW0603
    _configured = verbose
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format=FORMAT)
    logging.getLogger().setLevel(level)  # basicConfig sets it only the first time
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)


def _more(ctx: click.Context, _: click.Parameter, count: int) -> None:
    if count:
        root = ctx.find_root()
        total = int(root.params.get("verbose") or 0) + count
        root.params["verbose"] = total
        configure(total)


def accept_after_subcommands(group: click.Group) -> None:
    """Give every subcommand of ``group`` (at any depth) a ``-v/--verbose`` that adds to
    ``segtxn -v``: ``segtxn topics list -v`` is ``segtxn -v topics list``. A lazy group's
    commands get it as they are loaded."""
    if isinstance(group, LazyGroup):
        group.when_loaded(_accept)
    for command in group.commands.values():
        _accept(command)


def _accept(command: click.Command) -> None:
    """``command``'s ``-v`` (and its subcommands', if a group), unless it has one."""
    if isinstance(command, click.Group):
        accept_after_subcommands(command)
    if any("-v" in p.opts for p in command.params):
        return
    command.params.append(
        click.Option(
            ["-v", "--verbose"],
            count=True,
            expose_value=False,
            callback=_more,
            help="More logging (as segtxn -v).",
        )
    )


def verbosity() -> int:
    """The ``-v`` count given to ``segtxn`` (0 outside a command)."""
    context = click.get_current_context(silent=True)
    if context is None:
        return 0
    return int(context.find_root().params.get("verbose") or 0)


def child_launch(env: Mapping[str, str] | None = None) -> Launch:
    """What the processes a command starts are given: INFO, or more if asked."""
    return Launch(verbosity=max(1, verbosity()), env=dict(env or {}))


def file_level() -> int:
    """The level of this process's log in a run's directory: INFO, DEBUG with ``-vv``."""
    return logging.DEBUG if verbosity() > 1 else logging.INFO
