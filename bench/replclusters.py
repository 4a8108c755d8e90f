"""``bench/replication.py``'s set-up: the run's settings, the two clusters of broker
processes (unreplicated and replicated 3/2) on a private etcd, and the client helpers that
both of its halves use.

It is a module of its own so that the produce load (``replload.py``) and the take-over
trials (``takeover.py``) can each import it without importing one another or the script.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from common import ServerProcess

from segtxn.client import Client, Producer
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.protocol.names import TopicName

NAMESPACE = "persistent://bench/replication"
BROKERS = 3
REPLICATION = "3/2"


@dataclass(frozen=True)
class Settings:
    seconds: float
    rounds: int
    producers: int
    size: int
    trials: int
    session_ttl_s: float
    ctp_messages: int = 2000
    """Messages per transactional consume-transform-produce run (0: none)."""
    same_topic: bool = False
    """Every trial on one topic (its home after the last trial's kill), not a fresh one."""

    @property
    def takeover_limit_s(self) -> float:
        """A take-over (or a client call during one) taking longer than this has failed."""
        return 6 * self.session_ttl_s + 30


@dataclass
class Cluster:
    name: str
    brokers: list[ServerProcess]
    metrics_url: str
    """etcd's ``/metrics`` (``bench/txn.py``'s loop counts the store's writes)."""

    @property
    def urls(self) -> list[str]:
        return [b.url for b in self.brokers]

    def by_url(self, url: str) -> ServerProcess:
        for broker in self.brokers:
            if broker.url == url:
                return broker
        raise RuntimeError(f"{url} is no broker of the {self.name} cluster")


@contextlib.contextmanager
def clusters(directory: Path, session_ttl_s: float) -> Iterator[tuple[Cluster, Cluster]]:
    """A private etcd (fsync on) and two clusters of three brokers and a transaction
    coordinator on it: unreplicated and replicated 3/2; all stopped at the end."""
    etcd = EtcdServer.in_temp_dir()
    etcd.start()
    started: list[ServerProcess] = []
    try:
        made: list[Cluster] = []
        for name, tag, extra in (
            ("unreplicated", "r1", []),
            (f"replicated {REPLICATION}", "r3", ["--replication", REPLICATION]),
        ):
            brokers = []
            for i in range(BROKERS):
                command = ["broker", "--store", etcd.url(f"/{tag}"), "--broker-id", f"b{i}"]
                command += ["--data-dir", str(directory / tag / f"b{i}")]
                command += ["--session-ttl", f"{session_ttl_s:g}", *extra]
                brokers.append(ServerProcess(f"{tag}-b{i}", command, directory / f"{tag}-b{i}.log"))
            coordinator = ["coordinator", "--store", etcd.url(f"/{tag}")]
            made.append(Cluster(name, brokers, f"http://{etcd.endpoint}/metrics"))
            started += [
                *brokers,
                ServerProcess(f"{tag}-c", coordinator, directory / f"{tag}-c.log"),
            ]
        for broker in started:
            broker.start()
        for broker in started:
            broker.wait_ready()
        yield made[0], made[1]
    finally:
        for broker in reversed(started):
            broker.stop()
        etcd.stop()


async def new_producer(
    client: Client,
    topic: str,
    name: str,
    *,
    batching: bool = True,
    max_pending: int = 1000,
    send_timeout_s: float = 30.0,
) -> Producer:
    producer = await client.create_producer(
        topic,
        name=name,
        batching=batching,
        max_pending=max_pending,
        send_timeout_s=send_timeout_s,
    )
    if not isinstance(producer, Producer):
        raise TypeError(f"{topic} is not a persistent:// topic")
    return producer


async def owner_of(urls: list[str], topic: str) -> str:
    async with Client(urls) as client:
        url: str = await client.connector.broker_for(TopicName.parse(topic))
        return url
