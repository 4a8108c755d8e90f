"""A SegtxnCluster's store Secrets (``spec.metadataStore.tls``, ``auth``) reaching its
brokers and coordinators: the ``--store-*`` flags the real CLI accepts, each reading a
file of a mounted Secret (or the user from its environment), through the operator (Kopf
against kmock) as through the pure renderers; nothing of it without the fields, and
gone again when they are taken out."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import pytest

from segtxn.operator import render
from tests.manifests.podsecurity import violations
from tests.manifests.support import validate
from tests.operator.emulator import emulator, operator
from tests.operator.support import WAIT_S, offline
from tests.operator.test_render import by_kind, config_for, expand, minimal, parse
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)
STS, DEPLOY = "apps/v1/statefulsets", "apps/v1/deployments"
TLS = {"secretName": "etcd-client"}
AUTH = {"secretName": "etcd-user"}
WORKLOADS = [(STS, "StatefulSet/demo-broker"), (DEPLOY, "Deployment/demo-coordinator")]


def store_spec(**store: Any) -> dict[str, Any]:
    return minimal("SegtxnCluster", {"metadataStore": {"url": "etcd://e:2379/x", **store}})


def rendered(spec: dict[str, Any]) -> dict[str, render.Obj]:
    coordinator = minimal("TransactionCoordinator", {"clusterRef": "demo"})
    objects = [
        *render.render_cluster("demo", "segtxn", spec),
        *render.render_coordinator("demo", "segtxn", coordinator, spec),
    ]
    for obj in objects:
        validate(obj)
        assert violations(obj) == [], obj["metadata"]["name"]
    return by_kind(objects)


def mounted(pod: dict[str, Any]) -> dict[str, tuple[str, list[str]]]:
    """Mount path -> (Secret, its keys) of the pod's Secret volumes."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    out = {}
    for mount in pod["containers"][0].get("volumeMounts", []):
        secret = volumes.get(mount["name"], {}).get("secret")
        if secret is not None:
            keys = [i["path"] for i in secret.get("items", [])]
            out[mount["mountPath"]] = (secret["secretName"], keys)
    return out


def store_files(pod: dict[str, Any], params: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Each ``--store-*`` file flag -> (the Secret, the key) its file is mounted from."""
    mounts = mounted(pod)
    out = {}
    for flag in ("store_ca", "store_cert", "store_key", "store_password_file"):
        if params[flag] is None:
            continue
        path = PurePosixPath(params[flag])
        secret, keys = mounts[str(path.parent)]
        assert path.name in keys, (flag, keys)
        out[flag] = (secret, path.name)
    return out


@pytest.mark.parametrize(
    ("store", "files", "user"),
    [
        ({"tls": TLS}, {"store_ca": ("etcd-client", "ca.crt"),
                        "store_cert": ("etcd-client", "tls.crt"),
                        "store_key": ("etcd-client", "tls.key")}, None),
        ({"tls": {**TLS, "clientCertificate": False}},
         {"store_ca": ("etcd-client", "ca.crt")}, None),
        ({"tls": TLS, "auth": AUTH},
         {"store_ca": ("etcd-client", "ca.crt"), "store_cert": ("etcd-client", "tls.crt"),
          "store_key": ("etcd-client", "tls.key"),
          "store_password_file": ("etcd-user", "password")}, "<username>"),
        ({"auth": AUTH}, {"store_password_file": ("etcd-user", "password")}, "<username>"),
        ({}, {}, None),
    ],
    ids=["tls", "ca-only", "tls-and-user", "user", "none"],
)  # fmt: skip
def test_the_servers_read_the_store_secrets(
    store: dict[str, Any], files: dict[str, tuple[str, str]], user: str | None
) -> None:
    objects = rendered(store_spec(**store))
    for _, workload in WORKLOADS:
        pod = objects[workload]["spec"]["template"]["spec"]
        params = parse(expand(pod["containers"][0], config_for(objects, workload)))
        assert store_files(pod, params) == files, workload
        assert params["store_user"] == user
        if not store:
            assert "volumes" not in pod  # rendered exactly as before the fields existed
    refs = [
        v["valueFrom"]["secretKeyRef"]
        for v in objects["StatefulSet/demo-broker"]["spec"]["template"]["spec"]["containers"][0][
            "env"
        ]
        if "secretKeyRef" in v["valueFrom"]
    ]
    assert refs == ([{"name": "etcd-user", "key": "username"}] if user else [])


def test_a_changed_store_secret_rolls_both_workloads() -> None:
    before, after = rendered(store_spec(tls=TLS)), rendered(store_spec(tls={"secretName": "new"}))
    for _, workload in WORKLOADS:
        assert before[workload]["spec"]["template"] != after[workload]["spec"]["template"]


def _store_args(container: dict[str, Any]) -> list[str]:
    return [a for a in container["args"] if a.startswith("--store-")]


async def test_the_operator_mounts_them_and_takes_them_out_again() -> None:
    async with emulator() as emu, operator(emu, offline()):
        spec = {"metadataStore": {"url": "etcd://e:2379/x", "tls": TLS, "auth": AUTH}}
        await emu.create("SegtxnCluster", "demo", spec)
        await emu.create("TransactionCoordinator", "demo", {"clusterRef": "demo"})

        def pods() -> list[dict[str, Any]]:
            found = [emu.get(resource, name.split("/")[1]) for resource, name in WORKLOADS]
            return [f["spec"]["template"]["spec"] for f in found if f is not None]

        await wait_until(lambda: len(pods()) == 2, timeout=WAIT_S, what="both workloads")
        for pod in pods():
            container = pod["containers"][0]
            assert _store_args(container) == [
                "--store-ca=/etc/segtxn/store-tls/ca.crt",
                "--store-cert=/etc/segtxn/store-tls/tls.crt",
                "--store-key=/etc/segtxn/store-tls/tls.key",
                "--store-user=$(SEGTXN_STORE_USER)",
                "--store-password-file=/etc/segtxn/store-auth/password",
            ]
            assert mounted(pod) == {
                "/etc/segtxn/store-tls": ("etcd-client", ["ca.crt", "tls.crt", "tls.key"]),
                "/etc/segtxn/store-auth": ("etcd-user", ["password"]),
            }
        # Taken out of the spec (a merge patch's null): the brokers' template goes back
        # to plain text (the coordinators follow once the brokers have rolled, which
        # needs pods: tests/operator/test_ordering.py).
        await emu.patch(
            "SegtxnCluster", "demo", {"spec": {"metadataStore": {"tls": None, "auth": None}}}
        )
        await wait_until(
            lambda: not _store_args(pods()[0]["containers"][0]),
            timeout=WAIT_S,
            what="the flags gone from the brokers' StatefulSet",
        )
        assert mounted(pods()[0]) == {}
        assert not [
            v for v in pods()[0]["containers"][0]["env"] if v["name"].startswith("SEGTXN_STORE_U")
        ]
