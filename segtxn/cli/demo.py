"""``segtxn demo``: a keyed stream through a scalable topic on ``segtxn standalone``.

It starts ``segtxn standalone`` as a separate process (on the embedded store, or on a
private etcd with ``--store etcd-local``), creates a scalable topic with several range
segments, produces a keyed stream (each key's messages numbered), consumes it through one
subscription, and checks what it received: every message exactly once, each key's
messages in order, keys routed to the segment covering their hash. It prints a summary and
exits non-zero on any anomaly.
"""

from __future__ import annotations

import asyncio
import collections
import random
import sys
import tempfile
import time
from contextlib import AsyncExitStack

import aiohttp
import click

from segtxn.client import Client
from segtxn.metastore.etcd_server import EtcdServer, free_port
from segtxn.protocol.hashing import HASH_SPACE, key_hash

TOPIC = "topic://demo/orders/events"


async def run_demo(
    store: str, *, messages: int = 20_000, keys: int = 200, segments: int = 4, seed: int | None
) -> bool:
    seed = seed if seed is not None else random.randrange(2**32)
    async with AsyncExitStack() as stack:
        if store == "etcd-local":
            server = EtcdServer.in_temp_dir()
            await server.astart()
            stack.callback(server.stop)
            store = server.url("/demo")
            click.echo(f"started etcd at {server.endpoint}")
        url = await _start_standalone(stack, store)
        click.echo(f"segtxn standalone at {url} (store {store}); seed {seed}")
        async with Client(url) as client:
            return await _play(client, random.Random(seed), messages, keys, segments)
    raise AssertionError("unreachable")  # pragma: no cover


async def _start_standalone(stack: AsyncExitStack, store: str) -> str:
    port = free_port()
    log = stack.enter_context(tempfile.TemporaryFile())  # noqa: SIM115 - a file, not a pipe nobody drains
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "segtxn.cli", "standalone", "--port", str(port), "--store", store,
        stderr=log,
    )  # fmt: skip

    async def stop() -> None:
        if process.returncode is not None:
            return
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 15)
        except TimeoutError:
            process.kill()
            await process.wait()

    stack.push_async_callback(stop)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if process.returncode is not None:
                log.seek(0)
                why = log.read().decode(errors="replace").strip()
                raise click.ClickException(f"segtxn standalone exited at start-up: {why[-500:]}")
            try:
                async with session.get(url + "/readyz") as response:
                    if response.status == 200:
                        return url
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)  # the process is starting: nothing to wait on but its port
    raise click.ClickException("segtxn standalone did not become ready in 30 s")


async def _play(
    client: Client, rng: random.Random, messages: int, keys: int, segments: int
) -> bool:
    await client.admin.create_topic(TOPIC, segments=segments)
    consumer = await client.subscribe(TOPIC, "demo", initial_position="earliest")
    producer = await client.create_producer(TOPIC, name="demo-producer")
    key_names = [f"customer-{i:04d}" for i in range(keys)]
    next_seq: collections.Counter[str] = collections.Counter()
    sent_at: dict[tuple[str, int], float] = {}
    anomalies: list[str] = []
    last_seen: dict[str, int] = {}
    seen: set[tuple[str, int]] = set()
    latencies: list[float] = []
    per_segment: collections.Counter[str] = collections.Counter()
    acks: set[asyncio.Task[None]] = set()

    async def consume() -> None:
        for _ in range(messages):
            message = await consumer.receive(timeout_s=30)
            key, _, seq_text = message.value.decode().partition(":")
            seq = int(seq_text)
            latencies.append((time.perf_counter() - sent_at[key, seq]) * 1000)
            if (key, seq) in seen:
                anomalies.append(f"duplicate {key}:{seq}")
            seen.add((key, seq))
            if seq != last_seen.get(key, -1) + 1:
                anomalies.append(f"{key}: {seq} after {last_seen.get(key)}")
            last_seen[key] = seq
            per_segment[message.message_id.topic.rsplit("/", 1)[1]] += 1
            ack = asyncio.create_task(consumer.acknowledge(message))  # acks are pipelined
            acks.add(ack)
            ack.add_done_callback(acks.discard)

    started = time.perf_counter()
    consuming = asyncio.create_task(consume(), name="demo-consumer")
    futures = []
    for _ in range(messages):
        key = rng.choice(key_names)
        seq = next_seq[key]
        next_seq[key] += 1
        sent_at[key, seq] = time.perf_counter()
        futures.append(await producer.send_async(f"{key}:{seq}".encode(), key=key))
    ids = await asyncio.gather(*futures)
    produced_s = time.perf_counter() - started
    for message_id, (key, _seq) in zip(ids, sent_at, strict=True):
        segment = int(message_id.topic.rsplit("/", 1)[1])
        if segment != key_hash(key) * segments // HASH_SPACE:
            anomalies.append(f"{key} went to segment {segment}")
    await consuming
    await asyncio.gather(*acks)
    total_s = time.perf_counter() - started
    missing = len(sent_at) - len(seen)
    stats = await client.admin.stats(TOPIC)
    backlog = sum(s["stats"]["subscriptions"]["demo"]["backlog"] for s in stats["segments"])
    latencies.sort()
    click.echo(
        f"produced {messages} keyed messages ({keys} keys) in {produced_s:.2f}s "
        f"= {messages / produced_s:,.0f} msg/s"
    )
    p50, p99 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]
    click.echo(
        f"consumed and acknowledged all in {total_s:.2f}s (while producing); "
        f"send->receive p50 {p50:.1f} ms, p99 {p99:.1f} ms"
    )
    click.echo("per segment: " + ", ".join(f"{s}: {n}" for s, n in sorted(per_segment.items())))
    click.echo(f"missing {missing}, backlog after acks {backlog}, anomalies {len(anomalies)}")
    for anomaly in anomalies[:10]:
        click.echo(f"  {anomaly}")
    ok = not anomalies and missing == 0 and backlog == 0
    click.echo(
        "RESULT: every message once, per-key order kept, keys on their segments"
        if ok
        else "RESULT: ANOMALIES"
    )
    return ok
