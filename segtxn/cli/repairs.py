"""``--repair-*`` and ``--replica-sweep-*``: when a replicating server checks, repairs and
sweeps its ledgers (:class:`~segtxn.ledger.replicas.RepairSettings`, docs/ledger.md,
"Repair"), parsed once at start-up into the one ``repair`` argument the command gets.

Brokers take them all; a coordinator takes the ones its loop uses (it has no storage node
to sweep and loads nothing at a full check). They apply only with ``--replication``: given
without it they are a usage error, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from segtxn.cli.params import SECONDS, SECONDS_OR_ZERO, refuse_unless
from segtxn.ledger.replicas import RepairSettings

F = TypeVar("F", bound=Callable[..., None])

_DEFAULTS = RepairSettings()


@dataclasses.dataclass(frozen=True)
class _Flag:
    name: str
    """The option's parameter name (``--`` + dashes is the flag)."""
    field: str
    """The :class:`RepairSettings` field it sets."""
    type: click.ParamType[Any]
    help: str
    sweep: bool = False
    """Brokers only (their storage node's sweep, and the full check that loads topics)."""

    def option(self) -> Callable[[F], F]:
        return click.option(
            "--" + self.name.replace("_", "-"),
            self.name,
            default=getattr(_DEFAULTS, self.field),
            show_default=True,
            type=self.type,
            metavar="SECONDS" if self.type in (SECONDS, SECONDS_OR_ZERO) else "N",
            help=self.help + " (with --replication).",
        )


FLAGS = (
    _Flag(
        "repair_interval",
        "check_s",
        SECONDS,
        "How often the closed ledgers held here are checked for lost or lagging copies "
        "and repaired",
    ),
    _Flag(
        "repair_full_interval",
        "full_check_s",
        SECONDS,
        "How often the topics homed here but not loaded are read and loaded to repair",
        sweep=True,
    ),
    _Flag(
        "repair_members_interval",
        "members_check_s",
        SECONDS,
        "How often the registered storage nodes are listed; a change starts a check",
    ),
    _Flag(
        "repair_lost_after",
        "lost_after_s",
        SECONDS_OR_ZERO,
        "How long a broker may stay unregistered before its copies count as lost and are "
        "made again elsewhere",
    ),
    _Flag(
        "repair_max_copies",
        "max_copies",
        click.IntRange(min=1),
        "Ledgers repaired at once",
    ),
    _Flag(
        "replica_sweep_interval",
        "sweep_s",
        SECONDS,
        "How often this broker's storage node looks for replicas no ledger names",
        sweep=True,
    ),
    _Flag(
        "replica_sweep_grace",
        "sweep_grace_s",
        SECONDS,
        "How long such a replica must have been left alone before the sweep removes it",
        sweep=True,
    ),
)


def repair_options(*, broker: bool) -> Callable[[F], F]:
    """Add the repair flags (``broker``: the sweep's and the full check's too) to a command
    that has a ``--replication`` option; it gets them as one ``repair: RepairSettings``
    keyword argument instead."""
    flags = [f for f in FLAGS if broker or not f.sweep]

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def wrapped(*args: Any, **kwargs: Any) -> None:
            ctx = click.get_current_context()
            values = {f.field: kwargs.pop(f.name) for f in flags}
            for flag in flags:
                refuse_unless(
                    ctx, flag.name, kwargs.get("replication") is not None, "it needs --replication"
                )
            try:
                kwargs["repair"] = RepairSettings(**values)
            except ValueError as e:
                raise click.UsageError(str(e), ctx) from e
            command(*args, **kwargs)

        decorated: Callable[..., None] = wrapped
        for flag in reversed(flags):
            decorated = flag.option()(decorated)
        return decorated  # type: ignore[return-value]

    return decorate
