"""``--event-loop``: the event loop a server process runs on.

uvloop (libuv under asyncio's interface) by default where it is installed, which is every
Linux and macOS install: segtxn depends on it there. The servers spend most of their time
in the event loop's own machinery (callbacks, sockets, timers), and uvloop does that part
in C: measured on issue 16's consume-transform-produce loop, 7-10 % more transactions per
second at one message each and 5-10 % less server CPU per message, within noise at 100
(docs/design-notes.md, note 19). ``asyncio`` keeps
the standard library's loop, for a platform uvloop does not build on or to rule it out
when chasing a problem. Servers started in-process (tests, embedding applications) run on
whatever loop their caller runs.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import click

F = TypeVar("F", bound=Callable[..., None])

CHOICES = ("auto", "uvloop", "asyncio")
ENV = "SEGTXN_EVENT_LOOP"


@dataclass(frozen=True)
class EventLoop:
    name: str
    """``uvloop`` or ``asyncio``: what the process runs on."""
    factory: Callable[[], asyncio.AbstractEventLoop]


def _uvloop_installed() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def choose(choice: str, *, uvloop_installed: bool | None = None) -> EventLoop:
    """The loop ``choice`` names (``auto``: uvloop when installed, else asyncio's).

    Raises:
        click.BadParameter: ``uvloop`` asked for where it is not installed.
    """
    installed = _uvloop_installed() if uvloop_installed is None else uvloop_installed
    if choice == "asyncio" or (choice == "auto" and not installed):
        return EventLoop("asyncio", asyncio.new_event_loop)
    if not installed:
        raise click.BadParameter(
            "uvloop is not installed here (pip install uvloop; it does not build on "
            "Windows): use --event-loop asyncio or auto"
        )
    import uvloop

    return EventLoop("uvloop", uvloop.new_event_loop)


def _resolve(_: click.Context, __: click.Parameter, value: str) -> EventLoop:
    return choose(value)


def event_loop_option(command: F) -> F:
    """``--event-loop auto|uvloop|asyncio`` (also ``SEGTXN_EVENT_LOOP``); the command gets
    an :class:`EventLoop`."""
    return click.option(
        "--event-loop",
        type=click.Choice(CHOICES),
        default="auto",
        show_default=True,
        envvar=ENV,
        show_envvar=True,
        callback=_resolve,
        help="The event loop to serve on: uvloop (faster), asyncio (the standard "
        "library's), or auto (uvloop where it is installed).",
    )(command)
