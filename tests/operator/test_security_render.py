"""What a secured cluster renders, as pure functions: objects valid for Kubernetes 1.30 and
restricted pods, commands the real CLI accepts reading the mounted files, a coordinator's
advertised pod name that its certificate covers; and bad input said clearly."""

from __future__ import annotations

from typing import Any

import click
import pytest
from click.testing import CliRunner

from segtxn.cli.commands import main
from segtxn.cli.security import pod_dns_url
from segtxn.operator import render, security, securitynames
from segtxn.operator.security import InvalidSecurity, SecuritySpec
from tests.manifests.podsecurity import violations
from tests.manifests.support import validate
from tests.operator.test_render import by_kind, config_for, expand, minimal, parse

SPEC = minimal(
    "SegtxnCluster",
    {
        "metadataStore": {"url": "etcd://e:2379"},
        "security": {
            "enabled": True,
            "roles": {"orders-app": [{"resource": "acme/orders", "actions": ["produce"]}]},
        },
    },
)


def covers(pattern: str, host: str) -> bool:
    """A certificate name matching a host as TLS checks it (a ``*`` is one whole label)."""
    if not pattern.startswith("*."):
        return pattern == host
    label, _, rest = host.partition(".")
    return bool(label) and rest == pattern[2:]


def secured_objects() -> dict[str, render.Obj]:
    coordinator = minimal("TransactionCoordinator", {"clusterRef": "demo"})
    objects = [
        *render.render_cluster("demo", "segtxn", SPEC),
        *render.render_coordinator("tc", "segtxn", coordinator, SPEC),
    ]
    for obj in objects:
        validate(obj)
        assert violations(obj) == [], obj["metadata"]["name"]
    return by_kind(objects)


def test_the_servers_commands_read_the_mounted_files() -> None:
    objects = secured_objects()
    for workload, command in [("StatefulSet/demo-broker", "broker"),
                              ("Deployment/tc-coordinator", "coordinator")]:  # fmt: skip
        pod = objects[workload]["spec"]["template"]["spec"]
        container = pod["containers"][0]
        params = parse(expand(container, config_for(objects, workload)))
        assert params["advertise"].startswith("https://"), command
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        for flag in ("tls_cert", "tls_key", "tls_ca", "auth_public_key", "auth_cluster_token",
                     "auth_policy"):  # fmt: skip
            assert str(params[flag].parent) in mounts, (command, flag)
        assert params["auth_token_secret"] is None and not params["auth_protect_metrics"]
        config = config_for(objects, workload)
        assert security.POLICY_KEY in config  # coordinators roll with a new policy too
    coordinator = objects["Deployment/tc-coordinator"]["spec"]["template"]["spec"]
    config = config_for(objects, "Deployment/tc-coordinator")
    params = parse(expand(coordinator["containers"][0], config))
    advertised = pod_dns_url(params["advertise"], params["pod_dns"])
    assert advertised == "https://10-0-0-7.segtxn.pod:8081"
    host = advertised.split("//")[1].split(":")[0]
    assert any(covers(n, host) for n in securitynames.coordinator_dns_names("tc", "segtxn"))
    broker_host = "b-0.demo-broker-headless.ns.svc"  # expand()'s pod, in namespace "ns"
    assert any(covers(n, broker_host) for n in securitynames.broker_dns_names("demo", "ns"))


def test_a_secured_spec_renders_the_same_twice_and_off_renders_as_before() -> None:
    assert render.render_cluster("demo", "segtxn", SPEC) == render.render_cluster(
        "demo", "segtxn", SPEC
    )
    plain = minimal("SegtxnCluster", {"metadataStore": {"url": "etcd://e:2379"}})
    off: dict[str, Any] = {**plain, "security": {**SPEC["security"], "enabled": False}}
    without = {k: v for k, v in plain.items() if k != "security"}
    assert render.render_cluster("demo", "segtxn", off) == render.render_cluster(
        "demo", "segtxn", without
    )


@pytest.mark.parametrize(
    ("security_spec", "says"),
    [
        ({"enabled": True, "roles": {"segtxn-cluster": []}}, "reserved"),
        ({"enabled": True, "roles": {"app": [{"resource": "a", "actions": ["produce"]}]}},
         "roles.app[0]: resource 'a'"),
        ({"enabled": True, "roles": {"app": [{"resource": "a/b", "actions": ["write"]}]}},
         "actions ['write']"),
        ({"enabled": True, "certificates": "cert-manager", "clientCertificates": True},
         "clientCertificates: needs certificates: operator"),
    ],
)  # fmt: skip
def test_a_policy_the_servers_would_refuse_is_named(
    security_spec: dict[str, Any], says: str
) -> None:
    with pytest.raises(InvalidSecurity) as caught:
        SecuritySpec.of({"security": security_spec}).policy()
    assert says in str(caught.value) and security.FIELD in str(caught.value)


def test_pod_dns_needs_an_address_to_advertise() -> None:
    with pytest.raises(click.BadParameter, match="must be an IP address"):
        pod_dns_url("https://coordinator:8081", "ns.pod")
    assert pod_dns_url("https://[fd00::7]:8081", "ns.pod") == "https://fd00--7.ns.pod:8081"
    args = ["coordinator", "--store=memory://", "--advertise=http://c1:8081", "--pod-dns=ns.pod"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert "--advertise http://c1:8081: the host must be an IP address" in result.output
