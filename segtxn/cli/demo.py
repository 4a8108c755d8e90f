"""``segtxn demo``: the main job. Start a cluster, run the transactional workload with splits,
merges, aborts, timeouts and a processor kill, then prove the guarantees with Spark.

On ``memory://`` (the default) the cluster is one ``segtxn standalone`` process on the
embedded store. On etcd (``etcd://host:port[/ns]``, or ``etcd-local`` for a private etcd
started for the run) it is two brokers and a transaction coordinator, each its own process.
The workload (:mod:`segtxn.verify.workload`) records every client's history; the checker
(:mod:`segtxn.verify.checker`) reads the topics back through the Spark data source and counts
every anomaly kind. The text report goes to the terminal, an HTML report with plots next to
the run's files; the exit status is non-zero on any anomaly.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
import click

from segtxn.metastore.etcd_server import EtcdServer, free_port
from segtxn.metastore.registry import open_store
from segtxn.verify.workload import WorkloadConfig, run_workload


async def run_demo(
    store: str,
    *,
    duration_s: float,
    rate: float,
    processors: int,
    out_dir: Path,
    seed: int,
    master: str,
) -> bool:
    run = f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{seed}"
    run_dir = out_dir / run
    async with AsyncExitStack() as stack:
        if store == "memory://":
            url = await _start(stack, "standalone", ["standalone", "--store", store], run_dir)
            click.echo(f"segtxn standalone at {url} (embedded store)")
        else:
            if store == "etcd-local":
                server = EtcdServer.in_temp_dir()
                await server.astart()
                stack.callback(server.stop)
                store = server.url("/demo")
                click.echo(f"started etcd at {server.endpoint}")
            else:
                await _check_store(store)
            url = await _start_cluster(stack, store, run_dir)
        config = WorkloadConfig(
            url=url,
            run_dir=run_dir,
            run=run,
            inputs=max(1, int(duration_s * rate)),
            rate=rate,
            processors=processors,
            seed=seed,
        )
        click.echo(
            f"workload: {config.inputs:,} inputs over {config.keys} keys at {rate:g}/s, "
            f"{processors} processors, aborts {config.abort_rate:.0%}, stalls past the "
            f"timeout {config.timeout_rate:.0%}, seed {seed}; recorded in {run_dir}"
        )
        info = await run_workload(config, click.echo)
        if not info.drained:
            click.echo(f"the processors did not consume every input in {config.drain_timeout_s} s")
        click.echo(f"checking with Spark ({master}) ...")
        # Spark's driver calls block, and the data source runs its own event loops
        return await asyncio.to_thread(_check, run_dir, master, info.ended - info.started)
    raise AssertionError("unreachable")  # pragma: no cover


def _check(run_dir: Path, master: str, run_s: float) -> bool:
    from segtxn.verify.checker import check, load
    from segtxn.verify.report import summary, write_html
    from segtxn.verify.spark import spark_session

    spark = spark_session(master, work_dir=run_dir / "spark")
    try:
        report = check(load(spark, run_dir))
    finally:
        spark.stop()
    click.echo(summary(report, run_s))
    html = run_dir / "report.html"
    write_html(report, run_s, html)
    click.echo(f"HTML report: {html}")
    return report.anomalies == 0


async def _check_store(store: str) -> None:
    """Fail early, with the store's own message, on a URL nothing can open."""
    opened = open_store(store)  # raises InvalidArgument for an unknown scheme
    await opened.close()


async def _start_cluster(stack: AsyncExitStack, store: str, run_dir: Path) -> str:
    """Two brokers and a coordinator on ``store``, each a process; returns a broker's URL."""
    urls = []
    for name in ("b1", "b2"):
        args = ["broker", "--store", store, "--broker-id", name]
        args += ["--data-dir", str(run_dir / "data" / name)]
        urls.append(await _start(stack, f"broker {name}", args, run_dir))
    await _start(stack, "coordinator", ["coordinator", "--store", store], run_dir)
    click.echo(f"cluster on {store}: brokers {', '.join(urls)} and a coordinator")
    return urls[0]


async def _start(stack: AsyncExitStack, what: str, args: list[str], run_dir: Path) -> str:
    """Start ``python -m segtxn.cli <args>`` on a free loopback port; its URL once ready."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    if args[0] == "standalone":
        args = [*args, "--port", str(port)]
    else:
        args = [*args, "--advertise", url, "--host", "127.0.0.1"]
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = stack.enter_context(open(logs / f"{what.replace(' ', '-')}.log", "w+b"))  # noqa: ASYNC230, SIM115
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "segtxn.cli", *args, stdout=log, stderr=log
    )

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
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if process.returncode is not None:
                log.seek(0)
                why = log.read().decode(errors="replace").strip()
                raise click.ClickException(f"{what} exited at start-up: {why[-500:]}")
            try:
                async with session.get(url + "/readyz") as response:
                    if response.status == 200:
                        return url
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)  # the process is starting: nothing to wait on but its port
    raise click.ClickException(f"{what} did not become ready in 30 s")


def default_out_dir() -> Path:
    return Path(tempfile.gettempdir()) / "segtxn-demo"
