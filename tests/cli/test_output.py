"""What the commands print (issue 21, item 5), against a real ``segtxn standalone``: lists of
every domain, times in words, ``-o table|json`` alike on every data command, ``consume``'s
summary, one line for a split or merge, and ``-v`` after the command."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

import pytest
from click.testing import CliRunner, Result

from segtxn.cli import verbosity
from segtxn.cli.commands import main
from segtxn.cli.output import Table, record, show, since, span, until
from segtxn.client import Client

EVENTS = "topic://acme/orders/events"


def ok(*args: str, url: str) -> Result:
    result = CliRunner().invoke(main, [*args, "--url", url])
    assert result.exit_code == 0, (args, result.output, result.stderr)
    return result


def as_json(*args: str, url: str) -> Any:
    return json.loads(ok(*args, "-o", "json", url=url).stdout)


def test_spans_and_times_in_words() -> None:
    assert [span(s) for s in (0, 115, 119.6, 600, 7300, 3 * 86400 + 4 * 3600)] == [
        "0 s",
        "115 s",
        "2 min",
        "10 min",
        "2 h 1 min",
        "3 d 4 h",
    ]
    assert until(1_115_000, now_ms=1_000_000) == "expires in 115 s"
    assert until(1_000_000, now_ms=1_003_000) == "expired 3 s ago"
    assert since(1_000_000, now_ms=1_120_000) == "2 min ago"


def test_tables_align_and_records_flatten(capsys: pytest.CaptureFixture[str]) -> None:
    table = Table(("name", "state"), [("a-long-name", "OPEN"), ("b", None)])
    assert table.render().splitlines() == [
        "NAME         STATE",
        "a-long-name  OPEN",
        "b            -",
    ]
    rows = record({"t": {"b": 2, "a": [1, 2]}, "createdMs": 0}, times={"createdMs": str}).rows
    assert rows == [("created", "0"), ("t.a", [1, 2]), ("t.b", 2)]
    show("json", {"b": 1, "a": [True]})
    assert json.loads(capsys.readouterr().out) == {"a": [True], "b": 1}
    show("table", [], Table(("topic",), [], empty="no topics in a/b"))
    assert capsys.readouterr() == ("", "no topics in a/b\n")  # stdout holds only data


def test_the_readme_topic_is_listed_with_every_domain(standalone: str) -> None:
    ok("topics", "create", EVENTS, "--segments", "4", url=standalone)
    ok("topics", "create", "persistent://acme/orders/audit", url=standalone)
    listed = ok("topics", "list", "acme/orders", url=standalone).stdout.splitlines()
    assert listed == ["TOPIC", "persistent://acme/orders/audit", EVENTS]
    assert as_json("topics", "list", "acme/orders", url=standalone) == [
        "persistent://acme/orders/audit",
        EVENTS,
    ]
    only = ok("topics", "list", "acme/orders", "--domain", "topic", url=standalone)
    assert only.stdout.splitlines() == ["TOPIC", EVENTS]


def test_split_and_merge_say_one_line_and_json_has_the_dag(standalone: str) -> None:
    topic = "topic://acme/layout/t"
    ok("topics", "create", topic, "--segments", "2", url=standalone)
    split = ok("topics", "split", topic, "0", url=standalone).stdout
    assert split == (
        f"split segment 0 [0x0000-0x7fff] of {topic} into 2 [0x0000-0x3fff] and "
        "3 [0x4000-0x7fff]; active segments: 1, 2, 3 (epoch 1)\n"
    )
    merged = ok("topics", "merge", topic, "2", "3", url=standalone).stdout
    assert merged == (
        f"merged segments 2 [0x0000-0x3fff] and 3 [0x4000-0x7fff] of {topic} into "
        "4 [0x0000-0x7fff]; active segments: 1, 4 (epoch 2)\n"
    )
    dag = as_json("topics", "split", topic, "1", url=standalone)
    assert dag["epoch"] == 3 and len(dag["segments"]) == 7


def test_consume_prints_a_summary_unless_asked(standalone: str) -> None:
    topic = "topic://acme/consume/t"
    ok("topics", "create", topic, url=standalone)
    sent = as_json("produce", topic, "-n", "6", "--keys", "3", url=standalone)
    assert sent["sent"] == 6 and sent["lastId"].startswith("segment://acme/consume/t/0@")
    quiet = ok("consume", topic, "a", "--idle-timeout", "1", url=standalone).stdout
    assert quiet.splitlines() == [
        f"received 6 messages (3 keys), first {topic.replace('topic', 'segment', 1)}/0@1:0, "
        f"last {sent['lastId']}"
    ]
    each = ok("consume", topic, "b", "--idle-timeout", "1", "--print", url=standalone).stdout
    assert len(each.splitlines()) == 7 and "key=key-0 b'00000000" in each
    data = as_json("consume", topic, "c", "--idle-timeout", "1", "--print", url=standalone)
    assert data["received"] == 6 and [m["key"] for m in data["messages"]][:2] == [
        "key-0",
        "key-1",
    ]
    assert "messages" not in as_json("consume", topic, "d", "--idle-timeout", "1", url=standalone)


def test_open_transactions_expire_in_words(standalone: str) -> None:
    async def opened() -> str:
        async with Client(standalone) as client:
            txn = await client.transaction(timeout_s=300).start()
            await client.close(timeout_s=0)  # leaves it open (a close that waits aborts it)
            return str(txn.id)

    txn = asyncio.run(opened())
    listed = ok("txn", "list", url=standalone).stdout.splitlines()
    assert listed[0].split() == ["TRANSACTION", "STATE", "DEADLINE", "OPENED"]
    row = next(line for line in listed if line.startswith(txn))
    assert "OPEN" in row and "expires in " in row and " s ago" in row
    assert "1795" not in row and "timeout_ms" not in row  # no raw epoch milliseconds
    raw = as_json("txn", "list", url=standalone)["transactions"]
    assert any(t["txnId"] == txn and isinstance(t["timeoutMs"], int) for t in raw)
    shown = ok("txn", "show", txn, url=standalone).stdout
    assert re.search(r"^timeout +expires in \d+ min$", shown, re.M), shown
    assert re.search(r"^created +\d+ s ago$", shown, re.M), shown
    assert as_json("txn", "abort", txn, url=standalone)["state"] == "ABORTED"


def test_every_data_command_takes_output(standalone: str) -> None:
    topic = "topic://acme/props/t"
    ok("topics", "create", topic, url=standalone)
    props = ok("topics", "properties", topic, "--set", "team=billing", url=standalone).stdout
    assert props.splitlines() == ["KEY   VALUE", "team  billing"]
    assert as_json("topics", "properties", topic, url=standalone) == {"team": "billing"}
    stats = ok("topics", "stats", topic, url=standalone).stdout.splitlines()
    assert stats[0] == f"{topic}: epoch 0, active segments: 1"
    assert stats[1].split()[:3] == ["SEGMENT", "STATE", "RANGE"]
    assert stats[2].split()[:3] == ["0", "ACTIVE", "0x0000-0xffff"]
    ok("topics", "create", "persistent://acme/props/p", url=standalone)
    plain = ok("topics", "stats", "persistent://acme/props/p", url=standalone).stdout
    assert re.search(r"^storage\.entriesWritten +0$", plain, re.M), plain  # a record
    assert as_json("topics", "stats", topic, url=standalone)["activeSegments"] == 1
    ok("consume", topic, "s", "--idle-timeout", "0.2", url=standalone)
    assert ok("topics", "subscriptions", topic, url=standalone).stdout.split() == [
        "SUBSCRIPTION",
        "s",
    ]
    assert as_json("topics", "subscriptions", topic, url=standalone) == ["s"]
    homes = as_json("brokers", "homes", "standalone", url=standalone)
    assert homes["broker"] == "standalone" and "segment://acme/props/t/0" in homes["homes"]


def test_verbose_after_the_command(standalone: str) -> None:
    quiet = ok("topics", "list", "acme/orders", url=standalone)
    assert verbosity.configured() == 0
    loud = CliRunner().invoke(
        main, ["-v", "topics", "list", "acme/orders", "-v", "--url", standalone]
    )
    assert loud.exit_code == 0 and loud.stdout == quiet.stdout
    assert verbosity.configured() == 2  # before and after the command add up: DEBUG
    assert logging.getLogger().getEffectiveLevel() == logging.DEBUG
    verbosity.configure(0)  # the next tests' root logger as it was
