"""Subcommands imported only when they run or show their help (click's "Lazily Loading
Subcommands" pattern).

Why: the commands' modules pull in the servers, the operator, Spark verification, auth and
more, over a second of CPU together, and every ``segtxn`` process paid for all of them: the
root's ``--help``, a client command such as ``segtxn topics list`` that needs none of the
servers, each process a test or a soak starts. A :class:`LazyGroup` knows its commands'
names and one-line summaries up front (:class:`Lazy`) and imports a command's module when
click resolves that command: to run it, to show its ``--help``, or to complete its
arguments. The group's own ``--help`` and the completion of command names use the
summaries and import nothing (a test holds each summary to its command's own help).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from gettext import gettext as _
from typing import Any

import click
from click.shell_completion import CompletionItem


class LazyCommandError(Exception):
    """A lazy entry names something that is not a click command of that name (a wiring bug)."""


@dataclass(frozen=True)
class Lazy:
    """A subcommand that is imported when used: ``target`` is ``module:attribute`` (a
    :class:`click.Command`), ``summary`` what the group's ``--help`` lists for it, which
    must be the command's ``get_short_help_str`` at any width: its help's first sentence,
    whole."""

    target: str
    summary: str

    def load(self) -> click.Command:
        module, attribute = self.target.split(":")
        command = getattr(importlib.import_module(module), attribute)
        if not isinstance(command, click.Command):
            raise LazyCommandError(f"{self.target} is not a click command")
        return command

    def placeholder(self, name: str) -> click.Command:
        """A command that only stands for this one in a listing (its summary as its help,
        shortened as click shortens the real one's)."""
        return click.Command(name, help=self.summary)


Loaded = Callable[[click.Command], None]
"""A hook called with each lazy command as its group loads it (:meth:`LazyGroup.when_loaded`)."""

_NoSuchCommand: Any = getattr(click.exceptions, "NoSuchCommand", None)
"""click's error for an unknown command name (8.4 on), which suggests close names."""


class _Commands(dict[str, click.Command]):
    """A group's commands: reading ``commands[name]`` of a lazy command that is not loaded
    yet loads it, as :meth:`LazyGroup.get_command` does (for code that reads the
    mapping; ``in``, ``get`` and iteration see the loaded ones only)."""

    def __init__(self, group: LazyGroup, loaded: Mapping[str, click.Command]) -> None:
        super().__init__(loaded)
        self._group = group

    def __missing__(self, name: str) -> click.Command:
        if name not in self._group.lazy:
            raise KeyError(name)
        return self._group.load(name)


class LazyGroup(click.Group):
    """A group whose ``lazy`` commands are imported on first use (see the module's doc);
    commands added as usual are there from the start."""

    def __init__(self, *args: Any, lazy: Mapping[str, Lazy] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})
        self.commands = _Commands(self, self.commands)
        self._when_loaded: list[Loaded] = []

    def when_loaded(self, hook: Loaded) -> None:
        """Call ``hook`` with each lazy command as it is loaded (and with none loaded
        before: apply it to ``commands`` for those)."""
        self._when_loaded.append(hook)

    def load(self, name: str) -> click.Command:
        """Import lazy command ``name`` and add it to the group.

        Raises:
            LazyCommandError: the entry names no command, or one of another name.
        """
        command = self.lazy[name].load()
        if command.name != name:
            raise LazyCommandError(f"{self.lazy[name].target} is {command.name!r}, not {name!r}")
        self.add_command(command, name)
        for hook in self._when_loaded:
            hook(command)
        return command

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            return self.load(cmd_name)
        return self.commands.get(cmd_name)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """click's, but an unknown name is told the close ones among all the commands
        ("Did you mean 'topics'?"): click's looks among ``commands``, the loaded ones."""
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as e:
            if _NoSuchCommand is None or not isinstance(e, _NoSuchCommand):
                raise
            names = self.list_commands(ctx)
            raise _NoSuchCommand(e.command_name, possibilities=names, ctx=e.ctx) from None

    def listed(self, name: str) -> click.Command | None:
        """What a listing shows for ``name``: the command if loaded, else its placeholder."""
        if name in self.commands:
            return self.commands[name]
        entry = self.lazy.get(name)
        return None if entry is None else entry.placeholder(name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's listing (``Group.format_commands``), from :meth:`listed`: no import."""
        commands = []
        for name in self.list_commands(ctx):
            command = self.listed(name)
            if command is not None and not command.hidden:
                commands.append((name, command))
        if commands:
            limit = formatter.width - 6 - max(len(name) for name, _ in commands)
            rows = [(name, command.get_short_help_str(limit)) for name, command in commands]
            with formatter.section(_("Commands")):  # click's heading, translated alike
                formatter.write_dl(rows)

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem]:
        """click's completion of command names (``Group.shell_complete``), from
        :meth:`listed`: a TAB imports nothing."""
        results = []
        for name in self.list_commands(ctx):
            command = self.listed(name) if name.startswith(incomplete) else None
            if command is not None and not command.hidden:
                results.append(CompletionItem(name, help=command.get_short_help_str()))
        results.extend(click.Command.shell_complete(self, ctx, incomplete))
        return results
