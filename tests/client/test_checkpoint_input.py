"""A checkpoint that is not one is refused, naming what is wrong, before anything is read."""

from __future__ import annotations

import json
from typing import Any

import pytest

from segtxn.client import Client
from tests.cluster import Cluster

TOPIC = "topic://acme/ckpt/t"

NOT_CHECKPOINTS: list[tuple[Any, str]] = [
    ({"bogus": 1}, "a checkpoint is a dict of 'next' and 'finished'"),
    (["next"], "a checkpoint is a dict of 'next' and 'finished'"),
    ({"next": {"segment://x/y/z/0": "1:0"}}, "a checkpoint's 'next' maps segment ids"),
    ({"next": {"0": "earliest"}}, "a checkpoint's 'next' maps segment ids"),
    ({"next": {"0": "1:-1"}}, "a checkpoint's 'next' maps segment ids"),
    ({"next": [["0", "1:0"]]}, "a checkpoint's 'next' maps segment ids"),
    ({"finished": "0"}, "a checkpoint's 'finished' lists segment ids"),
    ({"finished": [-1]}, "a checkpoint's 'finished' lists segment ids"),
    ({"finished": [True]}, "a checkpoint's 'finished' lists segment ids"),
]


@pytest.mark.parametrize("checkpoint", range(len(NOT_CHECKPOINTS)))
async def test_a_checkpoint_that_is_not_one_is_refused(cluster: Cluster, checkpoint: int) -> None:
    given, says = NOT_CHECKPOINTS[checkpoint]
    async with Client(cluster.url) as client:
        await client.admin.create_topic(TOPIC, segments=2)
        with pytest.raises(ValueError, match="^" + says.replace("(", r"\(")):
            await client.checkpoint_consumer(TOPIC, given)


async def test_a_saved_checkpoint_resumes(cluster: Cluster) -> None:
    async with Client(cluster.url) as client:
        await client.admin.create_topic(TOPIC, segments=2)
        producer = await client.create_producer(TOPIC)
        for i in range(4):
            await producer.send(f"m{i}".encode(), key=f"k{i}")
        first = await client.checkpoint_consumer(TOPIC)
        read = [(await first.receive(timeout_s=10)).value for _ in range(2)]
        saved = json.loads(json.dumps(first.checkpoint()))  # as an application keeps it
        await first.close()
        again = await client.checkpoint_consumer(TOPIC, saved)
        read += [(await again.receive(timeout_s=10)).value for _ in range(2)]
        assert sorted(read) == [b"m0", b"m1", b"m2", b"m3"]
