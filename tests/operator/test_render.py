"""Desired-state rendering: valid objects whose commands the real CLI accepts."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import click
import pytest
import yaml

from segtxn.broker.settings import BrokerSettings
from segtxn.cli.commands import main
from segtxn.operator import render, topicplan
from segtxn.operator.immutable import immutable_changes, same_quantity
from segtxn.operator.status import condition
from tests.manifests.support import ROOT, crd_schemas, validate
from tests.manifests.test_crds import defaulted

API = "segtxn.io/v1alpha1"


def example(kind: str) -> dict[str, Any]:
    for path in (ROOT / "manifests" / "examples").glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] == kind:
                return dict(defaulted(doc, crd_schemas()[(API, kind)]))
    raise AssertionError(kind)


def minimal(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A spec as the API server stores it: CRD defaults applied."""
    doc = {"apiVersion": API, "kind": kind, "metadata": {"name": "m"}, "spec": spec}
    return dict(defaulted(doc, crd_schemas()[(API, kind)])["spec"])


def expand(container: Mapping[str, Any], config: Mapping[str, str]) -> list[str]:
    """The container's args as the kubelet runs them: $(VAR) from its env (a Secret's
    key as ``<key>``)."""
    fields = {"metadata.name": "b-0", "metadata.namespace": "ns", "status.podIP": "10.0.0.7"}
    env = {}
    for var in container["env"]:
        source = var["valueFrom"]
        if "fieldRef" in source:
            env[var["name"]] = fields[source["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in source:
            env[var["name"]] = f"<{source['secretKeyRef']['key']}>"
        else:
            env[var["name"]] = config[source["configMapKeyRef"]["key"]]
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]]


def parse(args: list[str]) -> dict[str, Any]:
    """Parse ``args`` with the real ``segtxn`` command: what the pod would run."""
    command = main.commands[args[0]]
    with command.make_context(args[0], args[1:]) as ctx:
        return dict(ctx.params)


def by_kind(objects: list[render.Obj]) -> dict[str, render.Obj]:
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in objects}


def config_for(objects: dict[str, render.Obj], workload: str) -> dict[str, str]:
    """The data of the ConfigMap the pods of ``workload`` (``StatefulSet/demo-broker``)
    read: rendered with it, and named after its content."""
    name = render.config_ref(objects[workload])
    assert name is not None and re.fullmatch(r"[a-z0-9-]+-config-[0-9a-f]{16}", name), name
    return dict(objects[f"ConfigMap/{name}"]["data"])


@pytest.mark.parametrize(
    "spec",
    [
        example("SegtxnCluster")["spec"],
        minimal("SegtxnCluster", {"metadataStore": {"url": "etcd://e:2379"}}),
        minimal(
            "SegtxnCluster",
            {
                "metadataStore": {"url": "etcd://a:2379,b:2379/ns"},
                "brokers": {
                    "replicas": 1,
                    "port": 9000,
                    "storage": {"size": "1Gi", "storageClassName": "fast"},
                    "settings": {
                        "autoCreateTopics": True,
                        "consumerHoldSeconds": 0,
                        "headerWatch": "scoped",
                        "publishBufferBytes": 64 * 1024**2,
                        "retentionTimeSeconds": 0,
                        "retentionBytes": 10 * 1024**3,
                    },
                },
            },
        ),
    ],
    ids=["example", "minimal", "custom"],
)
def test_cluster_renders_valid_objects_the_broker_cli_accepts(spec: dict[str, Any]) -> None:
    objects = by_kind(render.render_cluster("demo", "segtxn", spec))
    for obj in objects.values():
        validate(obj)
    config = config_for(objects, "StatefulSet/demo-broker")
    assert sorted(objects)[1:] == [
        "PodDisruptionBudget/demo-broker",
        "Service/demo-broker",
        "Service/demo-broker-headless",
        "StatefulSet/demo-broker",
    ]
    assert sorted(objects)[0].startswith("ConfigMap/demo-config-")
    sts = objects["StatefulSet/demo-broker"]
    brokers = spec["brokers"]
    assert sts["spec"]["replicas"] == brokers["replicas"]
    claim = sts["spec"]["volumeClaimTemplates"][0]["spec"]
    assert claim["resources"]["requests"]["storage"] == brokers["storage"]["size"]
    assert claim.get("storageClassName") == brokers["storage"].get("storageClassName")
    container = sts["spec"]["template"]["spec"]["containers"][0]
    params = parse(expand(container, config))
    port = brokers["port"]
    assert params["store"] == spec["metadataStore"]["url"]
    assert params["advertise"] == f"http://b-0.demo-broker-headless.ns.svc:{port}"
    assert params["broker_id"] == "b-0" and params["port"] == port
    assert str(params["data_dir"]) == render.DATA_DIR
    assert params["consumer_hold"] == brokers["settings"]["consumerHoldSeconds"]
    assert params["header_watch"] == brokers["settings"].get("headerWatch", "prefix")
    assert (render.HEADER_WATCH in config) == ("headerWatch" in brokers["settings"])
    buffer = brokers["settings"].get("publishBufferBytes", BrokerSettings.max_publish_buffer_bytes)
    assert params["publish_buffer_size"] == buffer
    assert (render.PUBLISH_BUFFER in config) == ("publishBufferBytes" in brokers["settings"])
    assert params["auto_create_topics"] == brokers["settings"]["autoCreateTopics"]
    assert params["retention_time"] == brokers["settings"]["retentionTimeSeconds"]
    assert params["retention_size"] == brokers["settings"]["retentionBytes"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}
    assert container["volumeMounts"][0] == {"name": "data", "mountPath": render.DATA_DIR}
    # The example is on the chart's etcd, which requires its client certificate.
    store_tls = bool(spec["metadataStore"].get("tls"))
    assert (params["store_cert"] is not None) is store_tls
    assert len(container["volumeMounts"]) == 1 + store_tls
    headless = objects["Service/demo-broker-headless"]["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"]
    assert render.service_url("demo", "segtxn", spec) == f"http://demo-broker.segtxn.svc:{port}"


def test_config_changes_roll_the_pods_and_rendering_is_deterministic() -> None:
    spec = example("SegtxnCluster")["spec"]

    def pod_hash(s: dict[str, Any]) -> str:
        sts = by_kind(render.render_cluster("demo", "segtxn", s))["StatefulSet/demo-broker"]
        return str(sts["spec"]["template"]["metadata"]["annotations"][render.CONFIG_HASH])

    assert render.render_cluster("demo", "segtxn", spec) == render.render_cluster(
        "demo", "segtxn", spec
    )
    changed = {**spec, "metadataStore": {"url": "etcd://elsewhere:2379"}}
    assert pod_hash(changed) != pod_hash(spec)
    brokers = spec["brokers"]
    retention = {**brokers, "settings": {**brokers["settings"], "retentionBytes": 1 << 30}}
    assert pod_hash({**spec, "brokers": retention}) != pod_hash(spec)


def test_cluster_retention_defaults_are_the_brokers() -> None:
    """A cluster that says nothing about retention gets the broker's own defaults."""
    spec = minimal("SegtxnCluster", {"metadataStore": {"url": "etcd://e:2379"}})
    objects = by_kind(render.render_cluster("demo", "segtxn", spec))
    container = objects["StatefulSet/demo-broker"]["spec"]["template"]["spec"]["containers"][0]
    params = parse(expand(container, config_for(objects, "StatefulSet/demo-broker")))
    defaults = parse(["broker", "--store=memory://", "--data-dir=/d", "--advertise=http://h:1"])
    assert params["retention_time"] == defaults["retention_time"] == 7 * 24 * 3600
    assert params["retention_size"] == defaults["retention_size"] == -1


def test_coordinator_renders_valid_objects_the_coordinator_cli_accepts() -> None:
    cluster = example("SegtxnCluster")["spec"]
    spec = minimal(
        "TransactionCoordinator",
        {"clusterRef": "demo", "replicas": 3, "gcRetentionSeconds": 5, "coordinatorIds": 8},
    )
    objects = by_kind(render.render_coordinator("tc", "segtxn", spec, cluster))
    for obj in objects.values():
        validate(obj)
    config = config_for(objects, "Deployment/tc-coordinator")
    assert sorted(objects)[1:] == [
        "Deployment/tc-coordinator",
        "PodDisruptionBudget/tc-coordinator",
        "Service/tc-coordinator",
    ]
    # The coordinators' own ConfigMap, with only what they read of the cluster's settings.
    assert sorted(objects)[0].startswith("ConfigMap/tc-coordinator-config-")
    assert set(config) <= set(render.COORDINATOR_CONFIG)  # replication only when it is on
    assert {"storeUrl", "sessionTtlSeconds"} <= set(config)
    deployment = objects["Deployment/tc-coordinator"]
    assert deployment["spec"]["replicas"] == 3
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == cluster["image"]
    params = parse(expand(container, config))
    assert params["store"] == cluster["metadataStore"]["url"]
    assert params["advertise"] == "http://10.0.0.7:8081"
    assert params["ids"] == 8 and params["gc_retention"] == 5
    assert params["default_timeout"] == 60 and params["gc_sweep"] == 10
    assert render.coordinator_url("tc", "segtxn", spec, cluster) == (
        "http://tc-coordinator.segtxn.svc:8081"
    )


def test_verify_job_runs_commands_the_cli_accepts() -> None:
    job = yaml.safe_load((ROOT / "manifests" / "spark" / "verify-job.yaml").read_text())
    validate(job)
    pod = job["spec"]["template"]["spec"]
    for container in [*pod["initContainers"], *pod["containers"]]:
        args = container["args"]
        group = main.commands[args[0]]
        assert isinstance(group, click.Group)
        command = group.commands[args[1]]
        with command.make_context(args[1], args[2:]) as ctx:
            assert ctx.params["run_dir"] is not None


def seg(sid: int, lo: int, hi: int, state: str = "ACTIVE") -> dict[str, Any]:
    return {"id": sid, "range": [lo, hi], "state": state}


@pytest.mark.parametrize(
    ("segments", "target", "change"),
    [
        ([seg(0, 0, 0xFFFF)], None, None),
        ([seg(0, 0, 0xFFFF)], 1, None),
        ([seg(0, 0, 0xFFFF)], 2, topicplan.Split(0)),
        # the widest active segment splits; sealed ones never count
        (
            [seg(0, 0, 0xFFFF, "SEALED"), seg(1, 0, 0x3FFF), seg(2, 0x4000, 0xFFFF)],
            3,
            topicplan.Split(2),
        ),
        # a tie goes to the lowest id
        ([seg(3, 0x8000, 0xFFFF), seg(2, 0, 0x7FFF)], 3, topicplan.Split(2)),
        # the narrowest adjacent pair merges (ids need not be in range order)
        (
            [seg(5, 0x8000, 0xFFFF), seg(4, 0x1000, 0x7FFF), seg(3, 0, 0x0FFF)],
            2,
            topicplan.Merge(3, 4),
        ),
        # a one-hash segment cannot split
        ([seg(0, 0, 0)], 2, None),
    ],
)
def test_next_change(
    segments: list[dict[str, Any]],
    target: int | None,
    change: topicplan.Split | topicplan.Merge | None,
) -> None:
    assert topicplan.next_change(segments, target) == change


def test_topic_status_from_a_dag() -> None:
    dag = {
        "epoch": 3,
        "segments": [
            {**seg(0, 0, 0xFFFF, "SEALED"), "parents": [], "children": [1, 2]},
            {**seg(1, 0, 0x7FFF), "parents": [0], "children": []},
            {**seg(2, 0x8000, 0xFFFF), "parents": [0], "children": []},
        ],
    }
    status = topicplan.topic_status(dag, "topic://t/n/x")
    assert status["activeSegments"] == 2 and status["sealedSegments"] == 1
    assert status["epoch"] == 3 and status["segments"][0]["children"] == [1, 2]
    doc = {
        "apiVersion": API,
        "kind": "ScalableTopic",
        "metadata": {"name": "x"},
        "spec": {"clusterRef": "c", "tenant": "t", "namespace": "n", "topic": "x"},
        "status": status,
    }
    validate(doc)


def test_condition_moves_its_transition_time_only_when_its_status_changes() -> None:
    def set_(previous: Any, kind: str, ok: bool, why_at_gen: tuple[str, str, int]) -> Any:
        why, at, gen = why_at_gen
        return condition(
            previous, kind=kind, status=ok, reason=why, message="", now=at, generation=gen
        )

    first = set_(None, "Ready", False, ("a", "t1", 1))
    same = set_(first, "Ready", False, ("b", "t2", 2))
    flipped = set_(same, "Ready", True, ("c", "t3", 2))
    other = set_(flipped, "Applied", True, ("d", "t4", 3))
    assert [c["lastTransitionTime"] for c in (*first, *same, *flipped)] == ["t1", "t1", "t3"]
    assert same[0]["reason"] == "b" and same[0]["observedGeneration"] == 2
    assert [(c["type"], c["lastTransitionTime"], c["observedGeneration"]) for c in other] == [
        ("Applied", "t4", 3),
        ("Ready", "t3", 2),
    ]


def test_coordinators_roll_when_what_they_read_from_the_cluster_changes() -> None:
    """The coordinators read the store URL and the session TTL from their ConfigMap at
    start: a change to either must change their pod template (roll them); a broker-only
    setting must not (their ConfigMap, its name and their template stay the same)."""
    cluster = example("SegtxnCluster")["spec"]
    spec = minimal("TransactionCoordinator", {"clusterRef": "demo"})

    def template(c: dict[str, Any]) -> dict[str, Any]:
        objects = by_kind(render.render_coordinator("tc", "segtxn", spec, c))
        return dict(objects["Deployment/tc-coordinator"]["spec"]["template"])

    def with_settings(**settings: Any) -> dict[str, Any]:
        brokers = cluster["brokers"]
        return {**cluster, "brokers": {**brokers, "settings": {**brokers["settings"], **settings}}}

    before = template(cluster)["metadata"]["annotations"][render.CONFIG_HASH]
    ttl = template(with_settings(sessionTtlSeconds=99))["metadata"]["annotations"]
    store = template({**cluster, "metadataStore": {"url": "etcd://elsewhere:2379"}})
    hold = template(with_settings(consumerHoldSeconds=99))["metadata"]["annotations"]
    assert ttl[render.CONFIG_HASH] != before
    assert store["metadata"]["annotations"][render.CONFIG_HASH] != before
    assert hold[render.CONFIG_HASH] == before
    assert template(with_settings(consumerHoldSeconds=99)) == template(cluster)
    new_image = template({**cluster, "image": "segtxn:9.9.9"})["spec"]["containers"][0]
    assert new_image["image"] == "segtxn:9.9.9"


def test_rollouts_take_one_pod_at_a_time() -> None:
    cluster = example("SegtxnCluster")["spec"]
    spec = minimal("TransactionCoordinator", {"clusterRef": "demo"})
    deployment = by_kind(render.render_coordinator("tc", "segtxn", spec, cluster))[
        "Deployment/tc-coordinator"
    ]
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    sts = by_kind(render.render_cluster("demo", "segtxn", cluster))["StatefulSet/demo-broker"]
    # The operator replaces the brokers itself, one at a time (segtxn/operator/rolling.py).
    assert sts["spec"]["updateStrategy"] == {"type": "OnDelete"}


def test_immutable_changes_compare_with_what_is_applied() -> None:
    spec = minimal("SegtxnCluster", {"metadataStore": {"url": "etcd://e:2379/a"}})
    objects = by_kind(render.render_cluster("demo", "segtxn", spec))
    config = config_for(objects, "StatefulSet/demo-broker")
    sts = objects["StatefulSet/demo-broker"]
    assert immutable_changes(None, None, spec) == []  # nothing applied yet: anything goes
    assert immutable_changes(config, sts, spec) == []
    other_settings = {**spec, "image": "segtxn:2", "brokers": {**spec["brokers"], "replicas": 9}}
    assert immutable_changes(config, sts, other_settings) == []
    moved = {**spec, "metadataStore": {"url": "etcd://e:2379/b"}}
    [change] = immutable_changes(config, sts, moved)
    assert (change.field, change.applied, change.wanted) == (
        "spec.metadataStore.url",
        "etcd://e:2379/a",
        "etcd://e:2379/b",
    )
    assert "spec.metadataStore.url" in change.message()
    assert "etcd://e:2379/a" in change.message()

    def storage(**fields: str) -> dict[str, Any]:
        return {**spec, "brokers": {**spec["brokers"], "storage": fields}}

    grown = immutable_changes(config, sts, storage(size="20Gi"))
    assert [(c.field, c.applied, c.wanted) for c in grown] == [
        ("spec.brokers.storage.size", "10Gi", "20Gi")
    ]
    assert "expand each PersistentVolumeClaim" in grown[0].message()
    classed = immutable_changes(config, sts, storage(size="10Gi", storageClassName="fast"))
    assert [(c.field, c.applied, c.wanted) for c in classed] == [
        ("spec.brokers.storage.storageClassName", "", "fast")
    ]
    # The API server keeps quantities in canonical form: equal amounts are no change.
    canonical = dict(sts, spec=dict(sts["spec"]))
    claim = {"spec": {"resources": {"requests": {"storage": "10240Mi"}}}}
    canonical["spec"]["volumeClaimTemplates"] = [claim]
    assert immutable_changes(config, canonical, spec) == []


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("10Gi", "10Gi", True),
        ("1.5Gi", "1536Mi", True),
        ("1G", "1000M", True),
        ("1Gi", "1G", False),
        ("10Gi", "20Gi", False),
        ("lots", "lots", True),
        ("lots", "10Gi", False),
    ],
)
def test_quantities_compare_by_amount(a: str, b: str, same: bool) -> None:
    assert same_quantity(a, b) is same


def test_configmaps_are_named_by_their_content_and_applied_first() -> None:
    """A new configuration is a new, immutable ConfigMap, applied before the workload
    that names it (the handlers apply in the order rendered)."""
    cluster = example("SegtxnCluster")["spec"]
    tc = minimal("TransactionCoordinator", {"clusterRef": "demo"})
    brokers = render.render_cluster("demo", "segtxn", cluster)
    coordinators = render.render_coordinator("tc", "segtxn", tc, cluster)
    for objects, workload in ((brokers, "StatefulSet"), (coordinators, "Deployment")):
        assert objects[0]["kind"] == "ConfigMap" and objects[0]["immutable"] is True
        using = next(o for o in objects if o["kind"] == workload)
        assert render.config_ref(using) == objects[0]["metadata"]["name"]
    settings = cluster["brokers"]["settings"]
    ttl = {**cluster, "brokers": {**cluster["brokers"], "settings": {**settings,
           "sessionTtlSeconds": 99}}}  # fmt: skip
    again = render.render_cluster("demo", "segtxn", ttl)
    assert again[0]["metadata"]["name"] != brokers[0]["metadata"]["name"]
    assert render.render_cluster("demo", "segtxn", cluster)[0] == brokers[0]  # same content
    assert render.config_ref(None) is None
