"""``segtxn txn``: list, inspect and abort v5 transactions."""

from __future__ import annotations

import json
from typing import Any

import click

from segtxn.cli.service import URL, run
from segtxn.client import Client
from segtxn.client.transaction import Coordinators
from segtxn.protocol.txn import TxnId


@click.group()
def txn() -> None:
    """List, inspect and abort transactions."""


def _call(url: str, method: str, path: str, **kwargs: Any) -> Any:
    async def body(client: Client) -> Any:
        return await Coordinators(client.connector).call(method, path, **kwargs)

    return run(body, url)


def _txn_id(text: str) -> str:
    try:
        return str(TxnId.parse(text))
    except ValueError as e:
        raise click.BadParameter(str(e)) from e


@txn.command("list")
@URL
@click.option(
    "--limit",
    default=100,
    show_default=True,
    type=click.IntRange(1, 100_000),
    help="List at most this many.",
)
def list_(url: str, limit: int) -> None:
    """Open transactions, the soonest deadline first."""
    found = _call(url, "GET", "/txn/v2/open", params={"limit": str(limit)})
    for item in found["transactions"]:
        click.echo(f"{item['txnId']}  {item['state']}  timeout_ms={item['timeoutMs']}")


@txn.command("show")
@URL
@click.argument("txn_id")
def show(url: str, txn_id: str) -> None:
    """Print a transaction's header (MOST:LEAST in hex)."""
    click.echo(json.dumps(_call(url, "GET", f"/txn/v2/{_txn_id(txn_id)}"), indent=2))


@txn.command("abort")
@URL
@click.argument("txn_id")
def abort(url: str, txn_id: str) -> None:
    """Abort an open transaction (its writes and acks will never count)."""
    result = _call(url, "POST", f"/txn/v2/{_txn_id(txn_id)}/end", params={"action": "ABORT"})
    click.echo(f"{result['txnId']} {result['state']}")
