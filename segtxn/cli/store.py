"""``segtxn store defrag``: give the space etcd's compaction freed back to the disk.

etcd's database file never shrinks by itself (docs/metastore.md, "Compaction"); this
command defragments its members one at a time, only those with at least ``--min-free-mib``
of free pages, and only when every member answers (:mod:`segtxn.metastore.defrag`). Run it
by hand, from a CronJob, or with ``--every`` as a long-running loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any
from urllib.parse import urlsplit

import click

from segtxn.cli.output import OUTPUT, Table, show
from segtxn.cli.params import FloatRange, StoreUrl
from segtxn.cli.security import store_credentials, store_options
from segtxn.metastore import defrag as defrag_module
from segtxn.metastore.defrag import (
    MIB,
    DefragSettings,
    Round,
    defragment_round,
    run_defragmentation,
)
from segtxn.metastore.etcd import parse_endpoints


@click.group()
def store() -> None:
    """Maintain the metadata store."""


@store.command("defrag")
@click.option(
    "--store",
    "url",
    required=True,
    type=StoreUrl(),
    help="The etcd to defragment: etcd://host:port[,host:port...] (any of its members; "
    "each member is reached on its own client URL).",
)
@click.option(
    "--min-free-mib",
    default=DefragSettings.min_free_bytes // MIB,
    show_default=True,
    type=click.IntRange(min=1),
    help="Defragment a member once its database file holds this many MiB of free pages "
    "(dbSize - dbSizeInUse).",
)
@click.option(
    "--timeout",
    default=DefragSettings.timeout_s,
    show_default=True,
    type=FloatRange(min=1, max=3600),
    help="Seconds one member's defragmentation may take.",
)
@click.option(
    "--every",
    default=0.0,
    show_default=True,
    type=FloatRange(min=0),
    help="Look again every this many seconds until stopped (0: once).",
)
@store_options
@OUTPUT
def defrag(
    url: str, min_free_mib: int, timeout: float, every: float, output: str, **flags: Any
) -> None:
    """Defragment etcd's members one at a time, those whose database file holds at least
    --min-free-mib of free pages; nothing at all unless every member answers. Each member
    answers nothing while it defragments (1.4 s for a 75 MiB file, measured). Exit
    status 1 if the round was skipped."""
    parts = urlsplit(url)
    if parts.scheme != "etcd":
        raise click.BadParameter("defragmenting is for an etcd:// store", param_hint="--store")
    settings = DefragSettings(
        min_free_bytes=min_free_mib * MIB,
        check_s=every,
        timeout_s=timeout,
        credentials=store_credentials(flags, url),
    )
    endpoints = parse_endpoints(parts.netloc)
    if every:
        click.echo(f"defragmenting etcd members every {every:g} s (Ctrl-C stops)", err=True)
        logger = logging.getLogger(defrag_module.__name__)
        if logger.getEffectiveLevel() > logging.INFO:  # each member defragmented: a line
            logger.setLevel(logging.INFO)
        asyncio.run(run_defragmentation(endpoints, settings))
        return
    result = asyncio.run(defragment_round(endpoints, settings))
    _show(output, result)
    if result.skipped:
        raise SystemExit(1)


def _show(output: str, result: Round) -> None:
    done = {d.before.name: d for d in result.defragmented}
    rows = [
        [
            m.name,
            m.endpoint,
            "leader" if m.leader else "follower",
            f"{m.db_size / MIB:.1f}",
            f"{m.db_size_in_use / MIB:.1f}",
            f"{done[m.name].after.db_size / MIB:.1f} in {done[m.name].seconds:.2f} s"
            if m.name in done
            else "-",
        ]
        for m in result.members
    ]
    columns = ("member", "endpoint", "role", "db mib", "in use mib", "defragmented")
    data = {
        "members": [dataclasses.asdict(m) for m in result.members],
        "defragmented": [
            {"member": d.before.name, "dbSizeAfter": d.after.db_size, "seconds": d.seconds}
            for d in result.defragmented
        ],
        "skipped": result.skipped,
    }
    show(output, data, Table(columns, rows, empty="no member"))
    if result.skipped:
        click.echo(f"skipped: {result.skipped}", err=True)
