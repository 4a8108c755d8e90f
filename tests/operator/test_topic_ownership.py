"""A ScalableTopic changes and deletes only a topic it created (segtxn/operator/topicowner.py):
a topic that exists already is refused and survives the resource's deletion; a topic the
resource created is still deleted with it, and one replaced between the operator's read and
its delete is not (the brokers check the owner in the step that deletes). Kopf against
kmock, a real broker (its admin API keeps the owner in the topic's properties)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import kopf
import pytest
from aiohttp import web

from segtxn.client import Client, PreconditionFailed
from segtxn.client.admin import Admin
from segtxn.operator import topicowner
from segtxn.operator.handlers import OperatorConfig
from segtxn.protocol.errors import InvalidArgument, TopicNotFound
from segtxn.web import relay
from tests.operator.emulator import Emulator, emulator, operator
from tests.operator.support import WAIT_S, Local, cluster, orders, status
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(180)


def ready(emu: Emulator, name: str) -> dict[str, str]:
    found = [c for c in status(emu, "ScalableTopic", name).get("conditions", []) if
             c["type"] == "Ready"]  # fmt: skip
    return dict(found[0]) if found else {}


async def deleted(emu: Emulator, name: str) -> None:
    await emu.delete("ScalableTopic", name)
    await wait_until(lambda: emu.mine("ScalableTopic", name) is None, timeout=WAIT_S,
                     what=f"ScalableTopic {name} gone")  # fmt: skip


async def test_a_topic_clients_made_is_refused_and_not_deleted(shared_local: Local) -> None:
    spec, name = orders("clients-made")
    async with (
        emulator() as emu,
        operator(emu, shared_local.memo()),
        Client(shared_local.broker.url) as client,
    ):
        await cluster(emu, shared_local)
        await client.admin.create_topic(name, segments=1)  # as autoCreateTopics would
        await emu.create("ScalableTopic", "orders", {**spec, "targetSegments": 2})
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
        assert (await client.admin.stats(name))["activeSegments"] == 1

        # Before the fix, the deletion (deleteData true by default) force-deleted it.
        await deleted(emu, "orders")
        assert (await client.admin.stats(name))["activeSegments"] == 1
        assert any(r == "Kept" for _, r, _ in emu.events("orders"))


async def test_a_second_resource_for_a_managed_topic_deletes_nothing(shared_local: Local) -> None:
    spec, name = orders("second-resource")
    async with (
        emulator() as emu,
        operator(emu, shared_local.memo()),
        Client(shared_local.broker.url) as client,
    ):
        await cluster(emu, shared_local)
        await emu.create("ScalableTopic", "orders", spec)
        await wait_until(lambda: status(emu, "ScalableTopic", "orders").get("activeSegments")
                         == 1, timeout=WAIT_S, what="the topic created")  # fmt: skip
        first = emu.mine("ScalableTopic", "orders")
        assert first is not None
        properties = await client.admin.properties(name)
        assert properties[topicowner.OWNER_UID] == first["metadata"]["uid"]
        assert properties[topicowner.OWNER] == "segtxn/orders"
        assert "creating" not in status(emu, "ScalableTopic", "orders")

        await emu.create("ScalableTopic", "orders-test", spec)  # a copy, same topic
        await wait_until(
            lambda: ready(emu, "orders-test").get("reason") == "TopicOwnedElsewhere",
            timeout=WAIT_S,
            what="the copy refused",
        )
        assert "belongs to ScalableTopic segtxn/orders" in ready(emu, "orders-test")["message"]
        await deleted(emu, "orders-test")
        assert (await client.admin.stats(name))["activeSegments"] == 1

        # The owner's deletion still deletes its topic (deleteData true by default).
        await deleted(emu, "orders")
        with pytest.raises(TopicNotFound):
            await client.admin.stats(name)


class Intents:
    """What :func:`topicowner.ensure` says of its intent, in order."""

    def __init__(self) -> None:
        self.said: list[bool] = []

    async def __call__(self, creating: bool) -> None:
        self.said.append(creating)


async def test_a_create_whose_answer_was_lost_is_taken_a_re_created_resource_is_not(
    shared_local: Local,
) -> None:
    _, name = orders("lost-answer")
    mine = topicowner.Owner("uid-1", "segtxn/orders")
    async with Client(shared_local.broker.url) as client:
        admin: Admin = client.admin
        # The operator asked (status `creating`), the brokers made the topic, and the
        # answer or the property write was lost: the next attempt takes the topic.
        await admin.create_topic(name, segments=1)
        intents = Intents()
        assert await topicowner.ensure(admin, name, mine, segments=1, creating=True,
                                       intend=intents)  # fmt: skip
        assert (await admin.properties(name))[topicowner.OWNER_UID] == "uid-1"
        assert intents.said == []
        # Its own topic: nothing to do.
        assert not await topicowner.ensure(admin, name, mine, segments=1,
                                           creating=False, intend=intents)  # fmt: skip

        # The resource deleted (deleteData false) and created again under its name: another
        # uid, another resource; it does not inherit the topic.
        again = topicowner.Owner("uid-2", "segtxn/orders")
        with pytest.raises(topicowner.ForeignTopic) as refused:
            await topicowner.ensure(admin, name, again, segments=1, creating=False,
                                    intend=intents)  # fmt: skip
        assert refused.value.holder == "uid-1"
        assert "belongs to ScalableTopic segtxn/orders (uid uid-1)" in str(refused.value)
        # Even with its own `creating` set: the topic has an owner.
        with pytest.raises(topicowner.ForeignTopic):
            await topicowner.ensure(admin, name, again, segments=1, creating=True,
                                    intend=intents)  # fmt: skip

        # The intent is recorded before the create, and withdrawn when the brokers answer
        # that they made nothing.
        other = "topic://acme/lost-answer/refused"
        with pytest.raises(InvalidArgument):
            await topicowner.ensure(admin, other, mine, segments=0, creating=False,
                                    intend=intents)  # fmt: skip
        assert intents.said == [True, False]


# ---------------------------------------------------------------------- the read-delete race

Hook = Callable[[], Awaitable[None]]


class Interposer:
    """An HTTP relay between the operator and the broker: every call passes on as it is,
    and is recorded with the status it got. When armed, after the broker answered the next
    ``GET`` of ``topic``'s properties and before the operator gets that answer, the hook
    runs: the topic changes between the operator's read and its next call, every time."""

    def __init__(self, broker_url: str, http: aiohttp.ClientSession, topic: str) -> None:
        self.broker_url = broker_url
        self.properties_path = f"/admin/v2/{topic.replace('://', '/', 1)}/properties"
        self.http = http
        self.armed: Hook | None = None
        self.calls: list[tuple[str, str, int]] = []
        """(method, path and query, status), in order."""
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        answer = await relay(self.http, request, self.broker_url)
        self.calls.append((request.method, request.path_qs, answer.status))
        reading = request.method == "GET" and request.path == self.properties_path
        if reading and self.armed is not None:
            hook, self.armed = self.armed, None
            await hook()
        return answer

    def memo(self, local: Local) -> kopf.Memo:
        config = OperatorConfig(broker_url=self.url, coordinator_url=local.coordinator.url)
        return kopf.Memo(config=config)


@contextlib.asynccontextmanager
async def interposed(broker_url: str, topic: str) -> AsyncIterator[Interposer]:
    """An :class:`Interposer` for the broker at ``broker_url`` and ``topic``, on a free
    loopback port."""
    async with aiohttp.ClientSession() as http:
        interposer = Interposer(broker_url, http, topic)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", interposer.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            interposer.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            yield interposer
        finally:
            await runner.cleanup()


@pytest.mark.parametrize("new_owner", [None, "uid-of-another"], ids=["no-owner", "another"])
async def test_a_topic_replaced_between_the_operators_read_and_its_delete_is_kept(
    shared_local: Local, new_owner: str | None
) -> None:
    """The operator read the topic's owner (this resource), and before its delete arrived
    someone deleted the topic and created another under the name, without an owner (as
    ``autoCreateTopics`` would) or with another resource's. Before the fix the delete was a
    plain ``force`` and took the new topic with it; now the brokers refuse it
    (PreconditionFailed), the operator reads again, and keeps the topic as another's."""
    spec, name = orders("replaced-" + ("unowned" if new_owner is None else "owned"))
    async with (
        interposed(shared_local.broker.url, name) as interposer,
        emulator() as emu,
        operator(emu, interposer.memo(shared_local)),
        Client(shared_local.broker.url) as client,
    ):
        await cluster(emu, shared_local)
        await emu.create("ScalableTopic", "orders", spec)
        await wait_until(lambda: status(emu, "ScalableTopic", "orders").get("activeSegments")
                         == 1, timeout=WAIT_S, what="the topic created")  # fmt: skip
        mine = (await client.admin.properties(name))[topicowner.OWNER_UID]

        async def replace() -> None:
            await client.admin.delete_topic(name, force=True)
            await client.admin.create_topic(name, segments=3)
            if new_owner is not None:
                await client.admin.update_properties(
                    name, {topicowner.OWNER_UID: new_owner, topicowner.OWNER: "x/y"}
                )

        interposer.armed = replace
        await deleted(emu, "orders")

        assert interposer.armed is None  # the race happened
        assert (await client.admin.stats(name))["activeSegments"] == 3
        assert (await client.admin.properties(name)).get(topicowner.OWNER_UID) == new_owner
        assert any(r == "Kept" for _, r, _ in emu.events("orders"))
        refused = [(p, s) for m, p, s in interposer.calls if m == "DELETE"]
        assert len(refused) == 1, interposer.calls
        assert refused[0][1] == 412  # PreconditionFailed
        assert f"ifPropertyValue={mine}" in refused[0][0]


class Racing(Admin):
    """An Admin whose next properties read is followed by ``hook`` (once), before it
    returns: the topic changes between the read and the call after it."""

    def __init__(self, client: Client, hook: Hook) -> None:
        super().__init__(client.connector)
        self.hook: Hook | None = hook

    async def properties(self, topic: str) -> dict[str, str]:
        found = await super().properties(topic)
        hook, self.hook = self.hook, None
        if hook is not None:
            await hook()
        return found


async def test_a_topic_left_without_owner_is_deleted_only_while_it_has_none(
    shared_local: Local,
) -> None:
    """``creating`` (a create whose answer was lost) makes a topic without an owner this
    resource's: its deletion then asks for ``ifPropertyAbsent``, so a topic that gained an
    owner between the read and the delete is kept, and one that has none still goes."""
    _, name = orders("left-without-owner")
    mine = topicowner.Owner("uid-1", "segtxn/orders")
    async with Client(shared_local.broker.url) as client:
        await client.admin.create_topic(name)

        async def taken() -> None:
            await client.admin.update_properties(name, {topicowner.OWNER_UID: "uid-2"})

        racing = Racing(client, taken)
        assert not await topicowner.delete(racing, name, mine, creating=True)
        assert racing.hook is None
        assert (await client.admin.properties(name))[topicowner.OWNER_UID] == "uid-2"

        await client.admin.remove_property(name, topicowner.OWNER_UID)
        assert await topicowner.delete(client.admin, name, mine, creating=True)
        with pytest.raises(TopicNotFound):
            await client.admin.stats(name)


async def test_a_topic_that_keeps_changing_is_not_deleted_and_says_so(shared_local: Local) -> None:
    """Each read finds the topic this resource's, and each delete finds it another's: after
    :data:`topicowner.DELETE_ATTEMPTS` reads the deletion gives up with PreconditionFailed
    (the handler retries later), having deleted nothing."""
    _, name = orders("keeps-changing")
    mine = topicowner.Owner("uid-1", "segtxn/orders")
    async with Client(shared_local.broker.url) as client:
        await client.admin.create_topic(name)
        reads: list[str] = []

        class Flapping(Admin):
            async def properties(self, topic: str) -> dict[str, str]:
                await client.admin.update_properties(topic, mine.properties())  # handed back
                found = await super().properties(topic)
                reads.append(found[topicowner.OWNER_UID])
                await client.admin.update_properties(topic, {topicowner.OWNER_UID: "uid-2"})
                return found

        with pytest.raises(PreconditionFailed):
            await topicowner.delete(Flapping(client.connector), name, mine, creating=False)
        assert reads == ["uid-1"] * topicowner.DELETE_ATTEMPTS
        assert (await client.admin.stats(name))["activeSegments"] == 1
