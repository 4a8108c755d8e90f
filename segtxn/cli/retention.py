"""``--retention-time`` and ``--retention-size``: the broker-wide retention policy of
``segtxn broker`` and ``standalone`` (:mod:`segtxn.ledger.retention`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

from segtxn.ledger import RetentionPolicy
from segtxn.ledger.retention import DEFAULT_RETENTION_TIME_S, NO_LIMIT, check_limit

F = TypeVar("F", bound=Callable[..., None])


def _limit(_: click.Context, param: click.Parameter, value: float) -> float:
    try:
        check_limit(param.name or "value", value)
    except ValueError:
        raise click.BadParameter(f"must be -1 (no limit) or >= 0, not {value}") from None
    return value


def retention_options(command: F) -> F:
    """``--retention-time`` and ``--retention-size``: the broker-wide retention policy."""
    size = click.option(
        "--retention-size",
        default=NO_LIMIT,
        show_default=True,
        type=int,
        callback=_limit,
        metavar="BYTES",
        help="Also delete a consumed ledger once the consumed data newer than it reaches "
        "this many bytes (-1: no size limit).",
    )
    time = click.option(
        "--retention-time",
        default=DEFAULT_RETENTION_TIME_S,
        show_default=True,
        type=float,
        callback=_limit,
        metavar="SECONDS",
        help="Delete a ledger every subscription has consumed once it closed this long ago "
        "(-1: no time limit; 0: once consumed). Without subscriptions, keep data this long "
        "(0 or -1: forever). Unconsumed data is never deleted.",
    )
    return time(size(command))


def retention(retention_time: float, retention_size: int) -> RetentionPolicy:
    return RetentionPolicy(retention_time_s=retention_time, retention_bytes=retention_size)
