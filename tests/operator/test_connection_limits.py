"""The servers' connection limits in the custom resources: ``spec.brokers.settings`` of a
SegtxnCluster and the spec of a TransactionCoordinator take ``maxConnections``,
``maxConnectionsPerIp`` and ``idleTimeoutSeconds``, the servers' ``--max-connections``,
``--max-connections-per-ip`` and ``--idle-timeout``.

What they render (parsed by the real CLI), that a resource without them renders the pods it
had before they existed (an operator upgrade rolls no server), and that setting them on
running servers rolls them: the brokers one at a time, as any other setting (Kopf against
kmock; the brokers' admin endpoints faked), the coordinators through their Deployment's
new pod template.
"""

from __future__ import annotations

from typing import Any

import pytest

from segtxn.connlimits import ConnectionLimits
from segtxn.operator import connections, render
from tests.manifests.support import crd_schemas, validate
from tests.operator.emulator import Emulator, emulator, operator
from tests.operator.fakebrokers import serving
from tests.operator.support import WAIT_S, condition, config_of, offline, status
from tests.operator.test_publish_buffer import BEFORE_ARGS, BEFORE_ENV, BEFORE_HASH, broker, spec
from tests.operator.test_render import API, by_kind, config_for, expand, minimal, parse
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
DEPLOY = "apps/v1/deployments"
LIMITS = {"maxConnections": 5000, "maxConnectionsPerIp": 64, "idleTimeoutSeconds": 30.5}
PARSED = {"max_connections": 5000, "max_connections_per_ip": 64, "idle_timeout": 30.5}
""":data:`LIMITS` as the servers' command line parses them."""
DEFAULTS = {"max_connections": 0, "max_connections_per_ip": 0, "idle_timeout": 75.0}
"""The command line's defaults: automatic, no limit per address, 75 s."""
BROKER_FLAGS = [
    "--max-connections=$(SEGTXN_MAX_CONNECTIONS)",
    "--max-connections-per-ip=$(SEGTXN_MAX_CONNECTIONS_PER_IP)",
    "--idle-timeout=$(SEGTXN_IDLE_TIMEOUT)",
]
COORDINATOR_BEFORE_ARGS = [
    "coordinator",
    "--store=$(SEGTXN_STORE)",
    "--advertise=http://$(POD_IP):8081",
    "--port=8081",
    "--session-ttl=$(SEGTXN_SESSION_TTL)",
    "--ids=4",
    "--default-timeout=60",
    "--timeout-sweep=1",
    "--gc-sweep=10",
    "--gc-retention=60",
]
"""A minimal TransactionCoordinator's command line before the fields existed."""
COORDINATOR_BEFORE_HASH = "aa8591a31d20cf68"


def template(emu: Emulator) -> dict[str, Any]:
    """The brokers' live pod template: what a change of it would roll."""
    found = emu.get(STS, "demo-broker")
    assert found is not None
    return dict(found["spec"]["template"])


def limits(params: dict[str, Any]) -> dict[str, Any]:
    return {k: params[k] for k in PARSED}


def tc(**fields: Any) -> dict[str, Any]:
    return minimal("TransactionCoordinator", {"clusterRef": "demo", **fields})


def coordinator(objects: dict[str, render.Obj]) -> dict[str, Any]:
    deployment = objects["Deployment/tc-coordinator"]
    return dict(deployment["spec"]["template"]["spec"]["containers"][0])


def test_without_them_the_servers_pods_are_what_they_were() -> None:
    objects = by_kind(render.render_cluster("demo", "segtxn", spec()))
    config = config_for(objects, "StatefulSet/demo-broker")
    assert not set(connections.FIELDS) & set(config)
    container = broker(objects)
    assert container["args"] == BEFORE_ARGS
    assert [e["name"] for e in container["env"]] == BEFORE_ENV
    template = objects["StatefulSet/demo-broker"]["spec"]["template"]
    assert template["metadata"]["annotations"][render.CONFIG_HASH] == BEFORE_HASH
    assert limits(parse(expand(container, config))) == DEFAULTS
    ours = by_kind(render.render_coordinator("tc", "segtxn", tc(), spec()))
    container = coordinator(ours)
    assert container["args"] == COORDINATOR_BEFORE_ARGS
    template = ours["Deployment/tc-coordinator"]["spec"]["template"]
    assert template["metadata"]["annotations"][render.CONFIG_HASH] == COORDINATOR_BEFORE_HASH
    params = parse(expand(container, config_for(ours, "Deployment/tc-coordinator")))
    assert limits(params) == DEFAULTS
    # ...the defaults the servers run with when their flags are absent.
    default = ConnectionLimits()
    assert (default.max_connections, default.max_per_ip) == (None, None)
    assert default.idle_timeout_s == DEFAULTS["idle_timeout"]


def test_null_is_absent() -> None:
    """The API server prunes a null (the fields are not nullable); the operator, handed
    one all the same, renders what it renders without the field."""
    nulls = dict.fromkeys(LIMITS)
    assert render.render_cluster("demo", "segtxn", spec(**nulls)) == render.render_cluster(
        "demo", "segtxn", spec()
    )
    assert render.render_coordinator("tc", "segtxn", tc(**nulls), spec()) == (
        render.render_coordinator("tc", "segtxn", tc(), spec())
    )


def test_they_reach_the_broker_command_line_and_not_the_coordinators() -> None:
    """The ConfigMap keys, their env vars and the flags are all they add (with the
    ConfigMap's new name and hash); the coordinators, which do not read the brokers'
    settings, render the same."""
    without = by_kind(render.render_cluster("demo", "segtxn", spec()))
    with_them = by_kind(render.render_cluster("demo", "segtxn", spec(**LIMITS)))
    for obj in with_them.values():
        validate(obj)
    config = config_for(with_them, "StatefulSet/demo-broker")
    assert {k: config[k] for k in LIMITS} == {
        "maxConnections": "5000",
        "maxConnectionsPerIp": "64",
        "idleTimeoutSeconds": "30.5",
    }
    container = broker(with_them)
    assert limits(parse(expand(container, config))) == PARSED
    assert container["args"] == [*BEFORE_ARGS, *BROKER_FLAGS]
    added = [e for e in container["env"] if e["name"] not in BEFORE_ENV]
    assert [(e["name"], e["valueFrom"]["configMapKeyRef"]["key"]) for e in added] == [
        ("SEGTXN_MAX_CONNECTIONS", "maxConnections"),
        ("SEGTXN_MAX_CONNECTIONS_PER_IP", "maxConnectionsPerIp"),
        ("SEGTXN_IDLE_TIMEOUT", "idleTimeoutSeconds"),
    ]
    old, new = broker(without), dict(container)
    new["args"], new["env"] = new["args"][: len(BEFORE_ARGS)], new["env"][: len(BEFORE_ENV)]
    ref = added[0]["valueFrom"]["configMapKeyRef"]["name"]
    same = [{**e, "valueFrom": {"configMapKeyRef": {**e["valueFrom"]["configMapKeyRef"],
            "name": ref}}} if "configMapKeyRef" in e["valueFrom"] else e
            for e in old["env"]]  # fmt: skip
    assert new == {**old, "env": same}
    coordinators = [
        render.render_coordinator("tc", "segtxn", tc(), s) for s in (spec(), spec(**LIMITS))
    ]
    assert coordinators[0] == coordinators[1]


def test_they_reach_the_coordinator_command_line_and_not_the_configuration() -> None:
    """On the coordinators' command line as their other flags (their spec's, not the
    cluster's): their ConfigMap, which holds what they take from the cluster, stays."""
    without = by_kind(render.render_coordinator("tc", "segtxn", tc(), spec()))
    with_them = by_kind(render.render_coordinator("tc", "segtxn", tc(**LIMITS), spec()))
    for obj in with_them.values():
        validate(obj)
    container = coordinator(with_them)
    assert container["args"] == [
        *COORDINATOR_BEFORE_ARGS,
        "--max-connections=5000",
        "--max-connections-per-ip=64",
        "--idle-timeout=30.5",
    ]
    params = parse(expand(container, config_for(with_them, "Deployment/tc-coordinator")))
    assert limits(params) == PARSED
    old = coordinator(without)
    assert {**container, "args": container["args"][: len(COORDINATOR_BEFORE_ARGS)]} == old
    assert [k for k in with_them if k.startswith("ConfigMap/")] == [
        k for k in without if k.startswith("ConfigMap/")
    ]


@pytest.mark.parametrize("field", list(LIMITS))
def test_each_alone_is_its_own_flag(field: str) -> None:
    one = {field: LIMITS[field]}
    flag = connections.FIELDS[field].flag
    param = {"maxConnections": "max_connections", "maxConnectionsPerIp": "max_connections_per_ip",
             "idleTimeoutSeconds": "idle_timeout"}[field]  # fmt: skip
    expected = {**DEFAULTS, param: PARSED[param]}
    objects = by_kind(render.render_cluster("demo", "segtxn", spec(**one)))
    container = broker(objects)
    [added] = container["args"][len(BEFORE_ARGS) :]
    assert added.startswith(f"{flag}=$(")
    params = parse(expand(container, config_for(objects, "StatefulSet/demo-broker")))
    assert limits(params) == expected
    ours = by_kind(render.render_coordinator("tc", "segtxn", tc(**one), spec()))
    [added] = coordinator(ours)["args"][len(COORDINATOR_BEFORE_ARGS) :]
    assert added == f"{flag}={LIMITS[field]}"
    params = parse(expand(coordinator(ours), config_for(ours, "Deployment/tc-coordinator")))
    assert limits(params) == expected


@pytest.mark.parametrize("kind", ["SegtxnCluster", "TransactionCoordinator"])
def test_the_crd_bounds_are_the_servers(kind: str) -> None:
    """What the CRD admits the servers take (ConnectionLimits: counts of at least 1, a
    positive idle timeout; tests/operator/test_cli_bounds.py parses both ends); absent
    stays absent (no default: no ConfigMap key, no flag, no roll)."""
    properties = crd_schemas()[(API, kind)]["properties"]["spec"]["properties"]
    if kind == "SegtxnCluster":
        properties = properties["brokers"]["properties"]["settings"]["properties"]
    fields = {name: properties[name] for name in LIMITS}
    for name in ("maxConnections", "maxConnectionsPerIp"):
        assert (fields[name]["type"], fields[name]["minimum"]) == ("integer", 1)
    idle = fields["idleTimeoutSeconds"]
    assert (idle["type"], idle["minimum"], idle["maximum"]) == ("number", 1, 31536000)
    assert not [name for name, field in fields.items() if "default" in field]
    ConnectionLimits(max_connections=1, max_per_ip=1, idle_timeout_s=idle["minimum"])
    with pytest.raises(ValueError, match="at least 1"):
        ConnectionLimits(max_connections=fields["maxConnections"]["minimum"] - 1)


async def test_setting_them_on_a_running_cluster_rolls_the_brokers() -> None:
    fake = fake_brokers()
    fake.replicated = False
    async with serving(fake), emulator() as emu:
        breaches = watch(emu, fake)
        async with operator(emu, memo(fake)):
            await running(emu)
            assert not set(LIMITS) & set((config_of(emu) or {}).get("data", {}))
            await emu.patch("SegtxnCluster", "demo", {"spec": {"brokers": {"settings": LIMITS}}})

            def applied() -> bool:
                live = config_of(emu) or {}
                return bool(live.get("data", {}).get("maxConnections") == "5000")

            await wait_until(applied, timeout=WAIT_S, what="the connection limits applied")
            sts = emu.get(STS, "demo-broker")
            assert sts is not None
            args = sts["spec"]["template"]["spec"]["containers"][0]["args"]
            assert args[-len(BROKER_FLAGS) :] == BROKER_FLAGS
            await set_revision(emu, "r2")
            await each_replaced(emu, fake)
            assert "roll" not in status(emu, "SegtxnCluster", "demo")
        assert fake.log == [("delete", b) for b in reversed(BROKERS)]
        assert breaches == []
        assert [revision(emu, b) for b in BROKERS] == ["r2", "r2", "r2"]


async def test_setting_them_on_running_coordinators_rolls_their_deployment() -> None:
    """Applied at once by the coordinators' own handler (nothing they take from the
    cluster changes: no wait for the cluster's roll), as a new pod template, which the
    Deployment rolls out one coordinator at a time; the brokers are not touched."""
    async with emulator() as emu, operator(emu, offline()):
        await emu.create("SegtxnCluster", "demo", {"metadataStore": {"url": "etcd://e:2379/c"}})
        await emu.create("TransactionCoordinator", "tc", {"clusterRef": "demo"})

        def args() -> list[str]:
            found = emu.get(DEPLOY, "tc-coordinator")
            return (
                [] if found is None else found["spec"]["template"]["spec"]["containers"][0]["args"]
            )

        await wait_until(lambda: bool(args()), timeout=WAIT_S, what="the coordinators")
        assert args() == COORDINATOR_BEFORE_ARGS
        await wait_until(lambda: emu.get(STS, "demo-broker") is not None,
                         timeout=WAIT_S, what="the brokers")  # fmt: skip
        brokers = template(emu)
        await emu.patch("TransactionCoordinator", "tc", {"spec": LIMITS})
        await wait_until(
            lambda: (
                args()[len(COORDINATOR_BEFORE_ARGS) :]
                == ["--max-connections=5000", "--max-connections-per-ip=64", "--idle-timeout=30.5"]
            ),
            timeout=WAIT_S,
            what="the coordinators' new pod template",
        )
        await wait_until(
            lambda: condition(emu, "TransactionCoordinator", "tc", "Applied") == "True",
            timeout=WAIT_S,
            what="Applied True",
        )
        assert template(emu) == brokers
