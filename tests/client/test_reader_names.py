"""A reader reads one ``persistent://`` topic or one segment; asked for a whole scalable
topic it is refused at once, saying what to read instead (found trying the client as a new
user: ``create_reader("topic://...")`` failed with an internal ``KeyError('brokerUrl')``)."""

from __future__ import annotations

import pytest

from segtxn.client import Client, ErrorCategory, NotAllowed
from segtxn.metastore.etcd_server import free_port

SCALABLE = "topic://acme/readers/keyed"


def says_what_to_read(refused: NotAllowed) -> None:
    assert refused.category is ErrorCategory.FATAL
    said = str(refused)
    assert f"{SCALABLE} is a scalable topic" in said
    assert "segment://acme/readers/keyed/N" in said and "checkpoint_consumer()" in said


@pytest.mark.parametrize(
    "start, end", [("earliest", None), ("latest", None), ("earliest", "latest")]
)
async def test_a_reader_of_a_scalable_topic_is_refused(
    client: Client, start: str, end: str | None
) -> None:
    await client.admin.create_topic(SCALABLE, segments=2)
    with pytest.raises(NotAllowed) as refused:
        await client.create_reader(SCALABLE, start=start, end=end)
    says_what_to_read(refused.value)


async def test_it_is_refused_before_connecting() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with Client(url, operation_timeout_s=2) as client:
        with pytest.raises(NotAllowed) as refused:
            await client.create_reader(SCALABLE)
    says_what_to_read(refused.value)


async def test_its_segments_and_checkpoint_consumers_read_it(client: Client) -> None:
    await client.admin.create_topic(SCALABLE, segments=2)
    producer = await client.create_producer(SCALABLE)
    stored = await producer.send(b"m", key="k")
    reader = await client.create_reader(stored.topic)  # the segment it went to
    assert stored.topic.startswith("segment://acme/readers/keyed/")
    assert (await reader.receive(timeout_s=10)).value == b"m"
    whole = await client.checkpoint_consumer(SCALABLE)
    assert (await whole.receive(timeout_s=10)).value == b"m"
