"""A ScalableTopic changes and deletes only a topic it created (segtxn/operator/topicowner.py):
a topic that exists already is refused and survives the resource's deletion; a topic the
resource created is still deleted with it. Kopf against kmock, a real broker (its admin
API keeps the owner in the topic's properties)."""

from __future__ import annotations

import pytest

from segtxn.client import Client
from segtxn.client.admin import Admin
from segtxn.operator import topicowner
from segtxn.protocol.errors import InvalidArgument, TopicNotFound
from tests.operator.emulator import Emulator, emulator, operator
from tests.operator.support import WAIT_S, Local, cluster, status
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(180)
TOPIC = {"clusterRef": "demo", "tenant": "acme", "namespace": "ops", "topic": "orders"}
TOPIC_NAME = "topic://acme/ops/orders"


def ready(emu: Emulator, name: str) -> dict[str, str]:
    found = [c for c in status(emu, "ScalableTopic", name).get("conditions", []) if
             c["type"] == "Ready"]  # fmt: skip
    return dict(found[0]) if found else {}


async def deleted(emu: Emulator, name: str) -> None:
    await emu.delete("ScalableTopic", name)
    await wait_until(lambda: emu.mine("ScalableTopic", name) is None, timeout=WAIT_S,
                     what=f"ScalableTopic {name} gone")  # fmt: skip


async def test_a_topic_clients_made_is_refused_and_not_deleted(local: Local) -> None:
    async with (
        emulator() as emu,
        operator(emu, local.memo()),
        Client(local.broker.url) as client,
    ):
        await cluster(emu, local)
        await client.admin.create_topic(TOPIC_NAME, segments=1)  # as autoCreateTopics would
        await emu.create("ScalableTopic", "orders", {**TOPIC, "targetSegments": 2})
        await wait_until(lambda: ready(emu, "orders").get("reason") == "TopicOwnedElsewhere",
                         timeout=WAIT_S, what="the topic refused")  # fmt: skip
        refused = ready(emu, "orders")
        assert refused["status"] == "False"
        assert "was not created by the operator" in refused["message"]
        await wait_until(
            lambda: ("Warning", "TopicOwnedElsewhere", refused["message"]) in emu.events("orders"),
            timeout=WAIT_S,
            what="the Warning event",
        )
        # Not reshaped either: targetSegments is another owner's to decide.
        assert (await client.admin.stats(TOPIC_NAME))["activeSegments"] == 1

        # Before the fix, the deletion (deleteData true by default) force-deleted it.
        await deleted(emu, "orders")
        assert (await client.admin.stats(TOPIC_NAME))["activeSegments"] == 1
        assert any(r == "Kept" for _, r, _ in emu.events("orders"))


async def test_a_second_resource_for_a_managed_topic_deletes_nothing(local: Local) -> None:
    async with (
        emulator() as emu,
        operator(emu, local.memo()),
        Client(local.broker.url) as client,
    ):
        await cluster(emu, local)
        await emu.create("ScalableTopic", "orders", TOPIC)
        await wait_until(lambda: status(emu, "ScalableTopic", "orders").get("activeSegments")
                         == 1, timeout=WAIT_S, what="the topic created")  # fmt: skip
        first = emu.mine("ScalableTopic", "orders")
        assert first is not None
        properties = await client.admin.properties(TOPIC_NAME)
        assert properties[topicowner.OWNER_UID] == first["metadata"]["uid"]
        assert properties[topicowner.OWNER] == "segtxn/orders"
        assert "creating" not in status(emu, "ScalableTopic", "orders")

        await emu.create("ScalableTopic", "orders-test", TOPIC)  # a copy, same topic
        await wait_until(
            lambda: ready(emu, "orders-test").get("reason") == "TopicOwnedElsewhere",
            timeout=WAIT_S,
            what="the copy refused",
        )
        assert "belongs to ScalableTopic segtxn/orders" in ready(emu, "orders-test")["message"]
        await deleted(emu, "orders-test")
        assert (await client.admin.stats(TOPIC_NAME))["activeSegments"] == 1

        # The owner's deletion still deletes its topic (deleteData true by default).
        await deleted(emu, "orders")
        with pytest.raises(TopicNotFound):
            await client.admin.stats(TOPIC_NAME)


class Intents:
    """What :func:`topicowner.ensure` says of its intent, in order."""

    def __init__(self) -> None:
        self.said: list[bool] = []

    async def __call__(self, creating: bool) -> None:
        self.said.append(creating)


async def test_a_create_whose_answer_was_lost_is_taken_a_re_created_resource_is_not(
    local: Local,
) -> None:
    mine = topicowner.Owner("uid-1", "segtxn/orders")
    async with Client(local.broker.url) as client:
        admin: Admin = client.admin
        # The operator asked (status `creating`), the brokers made the topic, and the
        # answer or the property write was lost: the next attempt takes the topic.
        await admin.create_topic(TOPIC_NAME, segments=1)
        intents = Intents()
        assert await topicowner.ensure(admin, TOPIC_NAME, mine, segments=1, creating=True,
                                       intend=intents)  # fmt: skip
        assert (await admin.properties(TOPIC_NAME))[topicowner.OWNER_UID] == "uid-1"
        assert intents.said == []
        # Its own topic: nothing to do.
        assert not await topicowner.ensure(admin, TOPIC_NAME, mine, segments=1,
                                           creating=False, intend=intents)  # fmt: skip

        # The resource deleted (deleteData false) and created again under its name: another
        # uid, another resource; it does not inherit the topic.
        again = topicowner.Owner("uid-2", "segtxn/orders")
        with pytest.raises(topicowner.ForeignTopic) as refused:
            await topicowner.ensure(admin, TOPIC_NAME, again, segments=1, creating=False,
                                    intend=intents)  # fmt: skip
        assert refused.value.holder == "uid-1"
        assert "belongs to ScalableTopic segtxn/orders (uid uid-1)" in str(refused.value)
        # Even with its own `creating` set: the topic has an owner.
        with pytest.raises(topicowner.ForeignTopic):
            await topicowner.ensure(admin, TOPIC_NAME, again, segments=1, creating=True,
                                    intend=intents)  # fmt: skip

        # The intent is recorded before the create, and withdrawn when the brokers answer
        # that they made nothing.
        other = "topic://acme/ops/refused"
        with pytest.raises(InvalidArgument):
            await topicowner.ensure(admin, other, mine, segments=0, creating=False,
                                    intend=intents)  # fmt: skip
        assert intents.said == [True, False]
