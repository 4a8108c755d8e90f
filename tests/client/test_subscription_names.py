"""A subscription name no subscription can have is refused before connecting, with what is
wrong with it (found trying the client as a new user: ``subscribe(topic, "")`` made the
URL of another endpoint and was refused as "no such endpoint: GET /ws/v2/consumer/...")."""

from __future__ import annotations

from typing import Any

import pytest

from segtxn.client import Client, InvalidArgument

TOPIC = "topic://acme/names/in"


@pytest.mark.parametrize("name", ["", "a/b", "-starts-badly", "x" * 65])
async def test_a_bad_subscription_name_says_what_is_wrong(client: Client, name: str) -> None:
    await client.admin.create_topic(TOPIC, segments=1)
    with pytest.raises(InvalidArgument, match=r"subscription name .* must be 1-64 of letters"):
        await client.subscribe(TOPIC, name)


async def test_a_subscription_name_that_is_not_a_str_is_a_type_error(client: Client) -> None:
    wrong: Any = None
    with pytest.raises(TypeError, match="named by a str, not NoneType"):
        await client.subscribe(TOPIC, wrong)


async def test_the_longest_name_is_taken(client: Client) -> None:
    await client.admin.create_topic(TOPIC, segments=1)
    consumer = await client.subscribe(TOPIC, "x" * 64)
    await consumer.close()
