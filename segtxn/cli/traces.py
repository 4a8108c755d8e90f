"""Tracing of the ``segtxn`` commands (docs/tracing.md): the standard ``OTEL_*`` variables,
read once when a command starts, and ``--trace`` (``standalone``, ``demo``) for spans on
the console without setting any.

Every command reads the variables (a server traces what traced clients ask of it; a client
command such as ``produce`` traces what it does); the default ``service.name`` is
``segtxn-<command>``. With tracing on, log lines made under a span carry its ids
(:mod:`segtxn.cli.logs`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

from segtxn import tracing
from segtxn.cli import logs

F = TypeVar("F", bound=Callable[..., Any])

DEMO_SAMPLER = ("parentbased_traceidratio", "0.05")
"""``segtxn demo --trace`` keeps one transaction in twenty unless ``OTEL_TRACES_SAMPLER``
says otherwise: the demo runs thousands, and every one would be some twenty spans."""


def start(command: str | None) -> None:
    """Turn tracing on for ``segtxn <command>`` if the ``OTEL_*`` variables ask for it.

    Raises:
        click.UsageError: a setting segtxn cannot honour (exit 2, before anything starts).
    """
    try:
        on = tracing.configure(f"segtxn-{command or 'cli'}")
    except tracing.TracingConfigError as e:
        raise click.UsageError(str(e)) from e
    if on:
        logs.show_span_ids()


def _console(ctx: click.Context, _: click.Parameter, value: bool) -> bool:
    if value:
        tracing.configure(f"segtxn-{ctx.info_name}", exporter="console")
        logs.show_span_ids()
    return value


def trace_option(command: F) -> F:
    """``--trace``: spans on stdout as JSON lines (the console exporter), whatever
    ``OTEL_TRACES_EXPORTER`` says; the command receives it as ``trace``."""
    return click.option(
        "--trace",
        is_flag=True,
        callback=_console,
        help="Print spans on stdout, one JSON object per line (OpenTelemetry's console "
        "exporter; OTEL_* variables set the rest, docs/tracing.md).",
    )(command)


def child_env(trace: bool, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """What the processes a ``--trace`` run starts are given: the console exporter, and
    :data:`DEMO_SAMPLER` unless a sampler is set."""
    if not trace:
        return {}
    env = {"OTEL_TRACES_EXPORTER": "console"}
    if "OTEL_TRACES_SAMPLER" not in environ:
        env["OTEL_TRACES_SAMPLER"], env["OTEL_TRACES_SAMPLER_ARG"] = DEMO_SAMPLER
    return env
