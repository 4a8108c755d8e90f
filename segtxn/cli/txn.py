"""``segtxn txn``: list, inspect and abort v5 transactions.

Tables say times in words (``expires in 115 s``, ``opened 2 min ago``); ``-o json`` gives the
coordinator's records as they are, with epoch-millisecond times.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from segtxn.cli.output import OUTPUT, Table, record, show, since, until
from segtxn.cli.service import URL, run
from segtxn.client import Client
from segtxn.client.coordinators import Coordinators
from segtxn.protocol.limits import MAX_LIST_LIMIT
from segtxn.protocol.txn import TxnId

TIMES = {"timeoutMs": until, "createdMs": since, "finalizedMs": since}
"""A transaction record's epoch-millisecond fields, in words."""


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
        raise click.BadParameter(str(e), param_hint="TXN_ID") from e


@txn.command("list")
@URL
@click.option(
    "--limit",
    default=100,
    show_default=True,
    type=click.IntRange(1, MAX_LIST_LIMIT),
    help="List at most this many.",
)
@OUTPUT
def list_(url: str, limit: int, output: str) -> None:
    """Open v5 transactions (scalable topics), the soonest deadline first. v4 ones live in
    their coordinator's log: 'txn show' finds one by its id."""
    found = _call(url, "GET", "/txn/v2/open", params={"limit": str(limit)})
    rows = [
        (item["txnId"], item["state"], until(item["timeoutMs"]), since(item["createdMs"]))
        for item in found["transactions"]
    ]
    columns = ("transaction", "state", "deadline", "opened")
    show(output, found, Table(columns, rows, empty="no open transactions"))


@txn.command("show")
@URL
@click.argument("txn_id")
@OUTPUT
def show_(url: str, txn_id: str, output: str) -> None:
    """Print a transaction's header (MOST:LEAST in hex)."""
    found = _call(url, "GET", f"/txn/v2/{_txn_id(txn_id)}")
    times: dict[str, Callable[[int], str]] = dict(TIMES)
    if found.get("state") != "OPEN" and isinstance(found.get("createdMs"), int):
        # decided: its deadline no longer applies, and "expires in" would say it does
        def allowed(timeout_ms: int) -> str:
            return f"{(timeout_ms - found['createdMs']) / 1000:g} s after it opened (decided)"

        times["timeoutMs"] = allowed
    show(output, found, record(found, times=times))


@txn.command("abort")
@URL
@click.argument("txn_id")
@OUTPUT
def abort(url: str, txn_id: str, output: str) -> None:
    """Abort an open transaction (its writes and acks will never count)."""
    result = _call(url, "POST", f"/txn/v2/{_txn_id(txn_id)}/end", params={"action": "ABORT"})
    show(output, result, f"{result['txnId']} {result['state']}")
