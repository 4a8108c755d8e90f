"""Token refresh in the client: a token file re-read when it changes, a supplier (plain or
async) called again before its token expires, and producers and consumers whose WebSockets
the broker closes at their token's expiry reconnecting with a fresh token, with every
message delivered once and in order. The CLI's ``--token-file``."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from segtxn.auth.tokens import LEEWAY_S
from segtxn.cli.commands import main
from segtxn.client import Client, Producer, SuppliedToken, TokenFile, Unauthenticated
from segtxn.protocol.tokens import TokenUnavailable, expiry_of
from tests.auth.conftest import PRODUCER_2, ROOT, SecureCluster, token
from tests.waiting import wait_until

TOPIC = "persistent://acme/orders/refreshed"
SHORT_S = 1.0
"""The life of the tokens the supplier hands out here: the broker closes LEEWAY_S later."""


def _replace(path: Path, text: str) -> None:
    new = path.with_name(path.name + ".new")
    new.write_text(text)
    os.replace(new, path)


async def test_a_token_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "token"
    source = TokenFile(path)
    with pytest.raises(TokenUnavailable, match="no token"):
        await source.get()
    _replace(path, "first\n")
    assert [await source.get() for _ in range(3)] == ["first"] * 3
    assert source.reads == 1  # not read again while it does not change
    _replace(path, "second")
    assert await source.get() == "second"
    _replace(path, "two words")  # broken: the last good token stays in use
    assert await source.get() == "second"
    path.unlink()
    assert await source.get() == "second"


async def test_a_supplier_is_called_again_before_its_token_expires() -> None:
    lasting = SuppliedToken(lambda: token(ROOT, ttl_s=3600), refresh_before_s=60)
    first = await lasting.get()
    assert await lasting.get() == first and lasting.calls == 1  # an hour left: kept
    expiring = SuppliedToken(lambda: token(ROOT, ttl_s=30), refresh_before_s=60)
    await expiring.get()
    await expiring.get()
    assert expiring.calls == 2  # 30 s left, under the 60 s margin: asked again


async def test_an_async_supplier_is_called_once_by_concurrent_requests() -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    async def supplier() -> str:
        started.set()
        await release.wait()
        return token(ROOT)

    source = SuppliedToken(supplier)
    waiting = [asyncio.create_task(source.get()) for _ in range(5)]
    await started.wait()
    release.set()
    assert len(set(await asyncio.gather(*waiting))) == 1
    assert source.calls == 1
    assert expiry_of(await source.get()) is not None


@pytest.mark.parametrize("bad", ["", "two words", 42], ids=["empty", "spaces", "not-a-string"])
async def test_a_supplier_that_gives_no_token_is_unauthenticated(
    secure: SecureCluster, bad: Any
) -> None:
    async with Client(secure.url, token=lambda: bad, operation_timeout_s=20) as client:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(Unauthenticated, match="the client has no token"):
            await client.admin.list_topics("persistent", "acme", "orders")
        assert loop.time() - started < 10, "not retried until the time limit"


async def test_websockets_closed_at_expiry_reconnect_with_a_fresh_token(
    secure: SecureCluster,
) -> None:
    async with Client(secure.url, token=token(ROOT)) as root:
        await root.admin.create_topic(TOPIC)
    supplied = SuppliedToken(lambda: token(PRODUCER_2, ttl_s=SHORT_S), refresh_before_s=0)
    async with Client(secure.url, token=supplied) as client:
        producer = await client.create_producer(TOPIC)
        assert isinstance(producer, Producer)  # a persistent:// topic's
        consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
        received: list[bytes] = []

        async def receive(n: int) -> None:
            for _ in range(n):
                message = await consumer.receive(timeout_s=SHORT_S + LEEWAY_S + 20)
                received.append(message.value)
                await consumer.acknowledge(message)

        for i in range(10):
            await producer.send(b"%d" % i)
        await receive(10)
        # the broker closes both at the first token's expiry; each reconnects by itself
        streams = list(consumer._streams.values())
        await wait_until(
            lambda: producer.reconnects >= 1 and all(s.reconnects >= 1 for s in streams),
            timeout=SHORT_S + LEEWAY_S + 20,
            what="the reconnects after the token expired",
        )
        for i in range(10, 20):
            await producer.send(b"%d" % i)
        await receive(10)
    assert received == [b"%d" % i for i in range(20)]  # each once, in order
    assert supplied.calls >= 2


async def test_the_cli_reads_its_token_from_a_file(secure: SecureCluster, tmp_path: Path) -> None:
    runner = CliRunner()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEGTXN_TOKEN")}
    path = tmp_path / "cli-token"
    path.write_text(token(ROOT) + "\n")

    def cli(*args: str) -> Any:
        return runner.invoke(main, list(args), env=env)

    create = ["topics", "create", "--url", secure.url, "persistent://acme/orders/from-file"]
    done = await asyncio.to_thread(cli, "--token-file", str(path), *create)
    assert done.exit_code == 0, done.output
    both = await asyncio.to_thread(cli, "--token", "t", "--token-file", str(path), *create)
    assert both.exit_code == 2 and "not both" in both.output
    missing = await asyncio.to_thread(cli, "--token-file", str(tmp_path / "none"), *create)
    assert missing.exit_code == 2, missing.output  # a usage error, before any request
    assert f"File '{tmp_path / 'none'}' does not exist" in missing.output, missing.output
