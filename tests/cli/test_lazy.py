"""The commands are loaded lazily (segtxn/cli/lazy.py): ``segtxn --help`` lists every
command as their own help says, without importing them, and a client command imports none
of the servers, the operator, Spark verification or auth.

Before, every ``segtxn`` process imported every command's module tree (over a second of
CPU): ``segtxn --help`` and ``segtxn topics list`` alike paid for the broker, the operator
and Spark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from segtxn.cli.commands import COMMANDS, main
from segtxn.cli.lazy import LazyGroup

ROOT = Path(__file__).resolve().parents[2]

WIDTHS = (30, 45, 60, 80, 100, 200)
"""Terminal widths to list the commands at: click shortens each summary to fit."""


def _lazy_groups(group: click.Group, path: str) -> Iterator[tuple[str, LazyGroup]]:
    """Every lazy group under ``group`` (itself included), loading every command."""
    ctx = click.Context(group, info_name=path)
    if isinstance(group, LazyGroup):
        yield path, group
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            yield from _lazy_groups(command, f"{path} {name}")


LAZY_GROUPS = list(_lazy_groups(main, "segtxn"))


def _listing(group: click.Group, width: int | None = None) -> str:
    """The Commands section of ``group``'s help at ``width`` columns (default: as click
    sizes it to the terminal, ``COLUMNS``)."""
    formatter = click.HelpFormatter(width=width)
    group.format_commands(click.Context(group, info_name="segtxn"), formatter)
    return formatter.getvalue()


def _unloaded_copy(group: LazyGroup) -> LazyGroup:
    """``group`` as a fresh process has it: its lazy commands not loaded yet."""
    eager = {n: c for n, c in group.commands.items() if n not in group.lazy}
    return LazyGroup(group.name, commands=eager, lazy=group.lazy)


def _eager_copy(group: LazyGroup) -> click.Group:
    """``group`` with every command loaded, as a plain click group (the listing before)."""
    ctx = click.Context(group)
    loaded = [group.get_command(ctx, name) for name in group.list_commands(ctx)]
    return click.Group(group.name, commands=[c for c in loaded if c is not None])


def test_the_lazy_groups_are_found() -> None:
    """The tests below see both lazy groups (or they would hold nothing)."""
    assert [path for path, _ in LAZY_GROUPS] == ["segtxn", "segtxn verify"]
    assert set(COMMANDS) <= set(main.commands)


@pytest.mark.parametrize(("path", "group"), LAZY_GROUPS, ids=[p for p, _ in LAZY_GROUPS])
def test_each_summary_is_its_command_s_short_help(path: str, group: LazyGroup) -> None:
    """A summary kept next to the lazy table cannot drift from its command's help."""
    for name, entry in group.lazy.items():
        real = group.commands[name]
        assert real.name == name, f"{path} {name}"
        assert entry.summary == real.get_short_help_str(limit=sys.maxsize), f"{path} {name}"
        placeholder = entry.placeholder(name)
        assert placeholder.get_short_help_str() == real.get_short_help_str(), f"{path} {name}"
        assert not real.hidden, f"{path} {name}: a hidden command would be listed"


@pytest.mark.parametrize(("path", "group"), LAZY_GROUPS, ids=[p for p, _ in LAZY_GROUPS])
def test_help_lists_the_commands_as_the_commands_themselves_would(
    path: str, group: LazyGroup
) -> None:
    """The listing from the summaries, at any width, is the listing the real commands
    give (click's own Group over them), and imports none of them."""
    unloaded = _unloaded_copy(group)
    eager = _eager_copy(group)
    for width in WIDTHS:
        assert _listing(unloaded, width) == _listing(eager, width), f"{path} at {width}"
    assert set(unloaded.commands) == set(group.commands) - set(group.lazy), "it loaded some"
    assert unloaded.list_commands(click.Context(unloaded)) == sorted(eager.commands)


def test_a_real_process_help_lists_every_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """``segtxn --help`` in a new process (nothing loaded) lists every command, with the
    real commands' short help."""
    monkeypatch.setenv("COLUMNS", "100")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    shown = subprocess.run(
        [sys.executable, "-m", "segtxn.cli", "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    expected = _listing(_eager_copy(main))
    assert expected.startswith("Commands:")
    assert expected in shown


PROBE = """
import json, sys
from click.testing import CliRunner
import segtxn.cli
from segtxn.cli.commands import main
result = CliRunner().invoke(main, sys.argv[1:])
said = {"exit": result.exit_code, "output": result.output, "modules": sorted(sys.modules)}
print(json.dumps(said))
"""
"""Runs ``segtxn ARGS...`` through CliRunner in a new interpreter; says what it imported."""

HEAVY = (
    "segtxn.broker",
    "segtxn.coordinator",
    "segtxn.operator",
    "segtxn.auth",
    "segtxn.web",
    "segtxn.cli.servers",
    "segtxn.cli.lifecycle",
    "segtxn.verify.job",
    "segtxn.verify.soak",
    "pyspark",
    "kopf",
    "jwt",
)
"""What a client command never needs: the servers, the operator, Spark verification, auth."""


def _imported(*args: str) -> tuple[int, str, list[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    probe = json.loads(done.stdout.splitlines()[-1])
    return probe["exit"], probe["output"], probe["modules"]


def _heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)]


@pytest.mark.parametrize(
    "args",
    [["--help"], ["topics", "--help"], ["topics", "list", "--help"], ["produce", "--help"]],
    ids=" ".join,
)
def test_a_client_command_imports_no_server(args: list[str]) -> None:
    exit_code, output, modules = _imported(*args)
    assert exit_code == 0, output
    assert _heavy(modules) == []


def test_a_client_command_against_a_cluster_imports_no_server(standalone: str) -> None:
    """A real run, not just its help: the client, the request, the table printed."""
    exit_code, output, modules = _imported("topics", "list", "public/default", "--url", standalone)
    assert exit_code == 0, output
    assert _heavy(modules) == []


def test_a_server_command_imports_its_server() -> None:
    """The probe above would see an eager import: ``broker --help`` does import the
    broker (it needs its settings for its flags)."""
    exit_code, output, modules = _imported("broker", "--help")
    assert exit_code == 0, output
    assert "segtxn.broker.app" in modules


def test_verify_run_does_not_import_the_soak() -> None:
    """``verify run``, which every soak and demo starts in many processes, imports
    neither the soak nor the Spark job."""
    exit_code, output, modules = _imported("verify", "run", "--help")
    assert exit_code == 0, output
    assert "segtxn.verify.soak" not in modules
    assert "segtxn.verify.job" not in modules


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["topcs"], "Error: No such command 'topcs'. Did you mean 'topics'?"),
        (["verify", "sok"], "Error: No such command 'sok'. Did you mean 'soak'?"),
    ],
)
def test_a_typo_is_told_the_close_names_of_commands_not_loaded(args: list[str], line: str) -> None:
    """click's "Did you mean" looks among the group's loaded commands only: a lazy group
    gives it every name (in a new process none is loaded)."""
    exit_code, output, _ = _imported(*args)
    assert exit_code == 2
    assert line in output


def test_reading_commands_loads_a_lazy_command() -> None:
    """``group.commands[name]`` (what code that builds a command's context reads) loads a
    lazy command, as resolving it does; ``get`` and ``in`` see the loaded ones only."""
    fresh = _unloaded_copy(main)
    assert "topics" not in fresh.commands
    assert fresh.commands.get("topics") is None
    assert fresh.commands["topics"] is main.commands["topics"]
    assert "topics" in fresh.commands
    with pytest.raises(KeyError):
        fresh.commands["no-such-command"]


def test_a_lazy_command_accepts_v_after_it() -> None:
    """``-v`` after a command adds to ``segtxn -v``, also for a command loaded lazily."""
    for _, group in LAZY_GROUPS:
        for name in group.lazy:
            assert any("-v" in p.opts for p in group.commands[name].params), name
    result = CliRunner().invoke(main, ["verify", "soak", "-v", "--help"])
    assert result.exit_code == 0, result.output
