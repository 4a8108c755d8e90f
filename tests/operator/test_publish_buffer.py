"""``spec.brokers.settings.publishBufferBytes``, the brokers' ``--publish-buffer-size``:
what it renders (parsed by the real broker CLI), that a cluster without it renders the
pods it had before the field existed (an operator upgrade rolls no broker), and that
setting it on a running cluster rolls the brokers, one at a time, as any other setting
(Kopf against kmock; the brokers' admin endpoints faked)."""

from __future__ import annotations

from typing import Any

import pytest

from segtxn.broker.settings import BrokerSettings
from segtxn.operator import render
from tests.manifests.support import crd_schemas, validate
from tests.operator.emulator import emulator, operator
from tests.operator.fakebrokers import serving
from tests.operator.support import WAIT_S, config_of, status
from tests.operator.test_render import by_kind, config_for, expand, minimal, parse
from tests.operator.test_rolling import (
    BROKERS,
    STS,
    each_replaced,
    fake_brokers,
    memo,
    revision,
    running,
    set_revision,
    watch,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)
STORE = "etcd://e:2379"
MIB = 1024 * 1024
BEFORE_ARGS = [
    "broker",
    "--store=$(SEGTXN_STORE)",
    "--data-dir=/data",
    "--advertise=http://$(POD_NAME).demo-broker-headless.$(POD_NAMESPACE).svc:8080",
    "--broker-id=$(POD_NAME)",
    "--port=8080",
    "--session-ttl=$(SEGTXN_SESSION_TTL)",
    "--consumer-hold=$(SEGTXN_CONSUMER_HOLD)",
    "--retention-time=$(SEGTXN_RETENTION_TIME)",
    "--retention-size=$(SEGTXN_RETENTION_SIZE)",
]
"""A minimal cluster's broker command line before the field existed."""
BEFORE_ENV = ["POD_NAME", "POD_NAMESPACE", "SEGTXN_STORE", "SEGTXN_SESSION_TTL",
              "SEGTXN_CONSUMER_HOLD", "SEGTXN_RETENTION_TIME", "SEGTXN_RETENTION_SIZE"]  # fmt: skip
BEFORE_HASH = "b1b3e33aa9639949"
"""A minimal cluster's ConfigMap hash (its name's suffix and the pod template's
``segtxn.io/config-hash``) before the field existed: a change of it rolls every such
cluster's brokers on the operator's upgrade."""


def spec(**settings: Any) -> dict[str, Any]:
    brokers = {"settings": settings} if settings else {}
    return minimal("SegtxnCluster", {"metadataStore": {"url": STORE}, "brokers": brokers})


def broker(objects: dict[str, render.Obj]) -> dict[str, Any]:
    return dict(objects["StatefulSet/demo-broker"]["spec"]["template"]["spec"]["containers"][0])


def test_without_it_the_brokers_pods_are_what_they_were() -> None:
    objects = by_kind(render.render_cluster("demo", "segtxn", spec()))
    config = config_for(objects, "StatefulSet/demo-broker")
    assert render.PUBLISH_BUFFER not in config
    container = broker(objects)
    assert container["args"] == BEFORE_ARGS
    assert [e["name"] for e in container["env"]] == BEFORE_ENV
    template = objects["StatefulSet/demo-broker"]["spec"]["template"]
    assert template["metadata"]["annotations"][render.CONFIG_HASH] == BEFORE_HASH
    assert f"ConfigMap/demo-config-{BEFORE_HASH}" in objects
    # ...and the brokers run with their own default.
    default = BrokerSettings.max_publish_buffer_bytes
    assert parse(expand(container, config))["publish_buffer_size"] == default


def test_it_reaches_the_broker_command_line_and_changes_nothing_else() -> None:
    """The ConfigMap key, its env var and the flag are all it adds (with the ConfigMap's
    new name and hash); the coordinators, which do not read it, render the same."""
    without = by_kind(render.render_cluster("demo", "segtxn", spec()))
    with_it = by_kind(render.render_cluster("demo", "segtxn", spec(publishBufferBytes=64 * MIB)))
    for obj in with_it.values():
        validate(obj)
    config = config_for(with_it, "StatefulSet/demo-broker")
    assert config[render.PUBLISH_BUFFER] == str(64 * MIB)
    container = broker(with_it)
    assert parse(expand(container, config))["publish_buffer_size"] == 64 * MIB
    assert container["args"] == [*BEFORE_ARGS, "--publish-buffer-size=$(SEGTXN_PUBLISH_BUFFER)"]
    [var] = [e for e in container["env"] if e["name"] not in BEFORE_ENV]
    assert var["name"] == "SEGTXN_PUBLISH_BUFFER"
    assert var["valueFrom"]["configMapKeyRef"]["key"] == render.PUBLISH_BUFFER
    old, new = broker(without), dict(container)
    new["args"], new["env"] = new["args"][:-1], [e for e in new["env"] if e is not var]
    ref = var["valueFrom"]["configMapKeyRef"]["name"]
    same = [{**e, "valueFrom": {"configMapKeyRef": {**e["valueFrom"]["configMapKeyRef"],
            "name": ref}}} if "configMapKeyRef" in e["valueFrom"] else e
            for e in old["env"]]  # fmt: skip
    assert new == {**old, "env": same}
    tc = minimal("TransactionCoordinator", {"clusterRef": "demo"})
    coordinators = [
        render.render_coordinator("tc", "segtxn", tc, s)
        for s in (spec(), spec(publishBufferBytes=64 * MIB))
    ]
    assert coordinators[0] == coordinators[1]


def test_the_crd_minimum_is_the_largest_message_the_brokers_accept() -> None:
    """Below it a broker refuses to start (BrokerSettings): the CRD refuses it first."""
    schema = crd_schemas()[("segtxn.io/v1alpha1", "SegtxnCluster")]
    field = schema["properties"]["spec"]["properties"]["brokers"]["properties"]["settings"][
        "properties"
    ]["publishBufferBytes"]
    largest = BrokerSettings.max_message_bytes
    assert field["type"] == "integer" and field["minimum"] == largest
    assert "default" not in field  # absent stays absent: no ConfigMap key, no roll
    BrokerSettings("b-0", "http://b:1", max_publish_buffer_bytes=largest)
    with pytest.raises(ValueError, match="must hold the largest message"):
        BrokerSettings("b-0", "http://b:1", max_publish_buffer_bytes=largest - 1)


async def test_setting_it_on_a_running_cluster_rolls_the_brokers() -> None:
    fake = fake_brokers()
    fake.replicated = False
    async with serving(fake), emulator() as emu:
        breaches = watch(emu, fake)
        async with operator(emu, memo(fake)):
            await running(emu)
            assert render.PUBLISH_BUFFER not in (config_of(emu) or {}).get("data", {})
            settings = {"publishBufferBytes": 64 * MIB}
            await emu.patch("SegtxnCluster", "demo", {"spec": {"brokers": {"settings": settings}}})

            def applied() -> bool:
                live = config_of(emu) or {}
                return bool(live.get("data", {}).get(render.PUBLISH_BUFFER) == str(64 * MIB))

            await wait_until(applied, timeout=WAIT_S, what="the publish buffer applied")
            sts = emu.get(STS, "demo-broker")
            assert sts is not None
            args = sts["spec"]["template"]["spec"]["containers"][0]["args"]
            assert "--publish-buffer-size=$(SEGTXN_PUBLISH_BUFFER)" in args
            await set_revision(emu, "r2")
            await each_replaced(emu, fake)
            assert "roll" not in status(emu, "SegtxnCluster", "demo")
        assert fake.log == [("delete", b) for b in reversed(BROKERS)]
        assert breaches == []
        assert [revision(emu, b) for b in BROKERS] == ["r2", "r2", "r2"]
