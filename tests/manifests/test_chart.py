"""The Helm chart with a real helm: lint, template, and every rendered object validated."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.manifests.support import (
    CHART,
    KUBE_VERSION,
    Doc,
    kinds,
    load_all,
    template,
    validate,
)

Helm = Callable[..., str]

VALUE_SETS = {
    "defaults": (),
    "with a cluster": ("cluster.create=true",),
    "external etcd, two namespaces": (
        "etcd.enabled=false",
        "operator.watchNamespaces={team-a,team-b}",
    ),
    "cluster-wide": ("operator.clusterWide=true",),
    "one etcd member, verbose": ("etcd.replicas=1", "operator.verbosity=2"),
    "etcd compacting by revision": (
        "etcd.autoCompaction.mode=revision",
        "etcd.autoCompaction.retention=100000",
    ),
}


def test_lint_strict(helm: Helm) -> None:
    out = helm("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize("sets", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_every_rendered_object_is_valid(helm: Helm, sets: tuple[str, ...]) -> None:
    docs = template(helm, *sets, crds=True)
    assert docs
    for doc in docs:
        validate(doc)
    assert kinds(docs).count("CustomResourceDefinition") == 6


def test_default_install(helm: Helm) -> None:
    docs = template(helm)
    assert kinds(docs) == [
        "CronJob",  # etcd's defragmentation
        "Deployment",
        "KopfPeering",  # without it the operator's watches stay paused
        "PodDisruptionBudget",
        "Role",  # the operator's, and the Spark driver's (VerificationRun)
        "Role",
        "RoleBinding",
        "RoleBinding",
        "Secret",  # the etcd's CA, its certificate, the servers' client certificate
        "Secret",
        "Secret",
        "Service",
        "Service",
        "ServiceAccount",
        "ServiceAccount",
        "StatefulSet",
    ]
    etcd = next(d for d in docs if d["kind"] == "StatefulSet")
    assert etcd["spec"]["replicas"] == 3
    args = etcd["spec"]["template"]["spec"]["containers"][0]["args"]
    cluster = next(a for a in args if a.startswith("--initial-cluster="))
    assert cluster.count("=https://") == 3  # every member named in the initial cluster
    # etcd keeps every revision until compacted: five minutes of history, a 4 GiB quota
    assert "--auto-compaction-mode=periodic" in args
    assert "--auto-compaction-retention=5m" in args
    assert "--quota-backend-bytes=4294967296" in args
    pdb = next(d for d in docs if d["kind"] == "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 2  # a quorum of 3 survives voluntary disruption
    operator = next(d for d in docs if d["kind"] == "Deployment")
    op_args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=segtxn" in op_args and "--peering=segtxn" in op_args


@pytest.mark.parametrize(("replicas", "min_available"), [(1, None), (3, 2), (5, 3), (7, 4)])
def test_the_etcd_budget_keeps_a_quorum_and_never_blocks_a_drain(
    helm: Helm, replicas: int, min_available: int | None
) -> None:
    """A majority stays through voluntary disruptions; a single member gets no budget
    (minAvailable 1 would refuse every eviction: a node drain waiting for ever)."""
    docs = template(helm, f"etcd.replicas={replicas}")
    budgets = [d["spec"] for d in docs if d["kind"] == "PodDisruptionBudget"]
    if min_available is None:
        assert budgets == []
    else:
        assert [b["minAvailable"] for b in budgets] == [min_available]
        assert min_available - 1 < replicas / 2 < min_available  # a majority, one evictable


# The operator's RBAC and the scope it watches: tests/operator/test_rbac.py.


PEERING_CASES = {
    "default": ((), "KopfPeering", ["segtxn"]),
    "watchNamespaces": (("operator.watchNamespaces={team-a,team-b}", "operator.peering=p"),
                        "KopfPeering", ["team-a", "team-b"]),
    "clusterWide": (("operator.clusterWide=true",), "ClusterKopfPeering", [None]),
}  # fmt: skip


@pytest.mark.parametrize(
    ("sets", "kind", "namespaces"), PEERING_CASES.values(), ids=PEERING_CASES.keys()
)
def test_the_peering_object_the_operator_waits_for_is_rendered(
    helm: Helm, sets: tuple[str, ...], kind: str, namespaces: list[str | None]
) -> None:
    """The operator runs with --peering=NAME, and Kopf keeps its watches paused until a
    peering object of that name exists where it watches: one in each watched namespace,
    or the cluster one when it watches every namespace (and no other kind)."""
    docs = template(helm, *sets)
    operator = next(d for d in docs if d["kind"] == "Deployment")
    args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    [name] = [a.removeprefix("--peering=") for a in args if a.startswith("--peering=")]
    peerings = [d for d in docs if d["kind"] in ("KopfPeering", "ClusterKopfPeering")]
    assert {d["kind"] for d in peerings} == {kind}
    assert [d["metadata"]["name"] for d in peerings] == [name] * len(namespaces)
    assert [d["metadata"].get("namespace") for d in peerings] == namespaces
    watched = [a.removeprefix("--namespace=") for a in args if a.startswith("--namespace=")]
    assert watched == [n for n in namespaces if n is not None]
    for doc in peerings:
        validate(doc)


def test_cluster_create_points_at_the_chart_etcd(helm: Helm) -> None:
    docs = template(helm, "cluster.create=true", "cluster.name=prod")
    cluster = next(d for d in docs if d["kind"] == "SegtxnCluster")
    assert cluster["spec"]["metadataStore"]["url"] == (
        "etcd://rel-segtxn-etcd.segtxn.svc:2379/prod"
    )
    service = next(
        d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "rel-segtxn-etcd"
    )
    assert service["spec"]["ports"][0]["port"] == 2379
    coordinator = next(d for d in docs if d["kind"] == "TransactionCoordinator")
    assert coordinator["spec"]["clusterRef"] == "prod"
    settings = cluster["spec"]["brokers"]["settings"]
    assert settings == {"retentionTimeSeconds": 604800, "retentionBytes": -1}  # a week


def test_cluster_retention_values_reach_the_cluster(helm: Helm) -> None:
    docs = template(
        helm,
        "cluster.create=true",
        "cluster.retentionTimeSeconds=0",
        "cluster.retentionBytes=107374182400",
    )
    cluster = next(d for d in docs if d["kind"] == "SegtxnCluster")
    validate(cluster)
    assert cluster["spec"]["brokers"]["settings"] == {
        "retentionTimeSeconds": 0,
        "retentionBytes": 100 * 1024**3,  # printed as an integer, not 1.073741824e+11
    }


def test_cluster_repair_interval_reaches_the_cluster(helm: Helm) -> None:
    docs = template(helm, "cluster.create=true", "cluster.repairIntervalSeconds=10")
    cluster = next(d for d in docs if d["kind"] == "SegtxnCluster")
    validate(cluster)
    assert cluster["spec"]["brokers"]["settings"]["repairIntervalSeconds"] == 10


def test_cluster_header_watch_reaches_the_cluster(helm: Helm) -> None:
    docs = template(helm, "cluster.create=true", "cluster.headerWatch=scoped")
    cluster = next(d for d in docs if d["kind"] == "SegtxnCluster")
    validate(cluster)
    assert cluster["spec"]["brokers"]["settings"]["headerWatch"] == "scoped"


def test_cluster_publish_buffer_reaches_the_cluster(helm: Helm, tmp_path: Path) -> None:
    docs = template(helm, "cluster.create=true", "cluster.publishBufferBytes=67108864")
    cluster = next(d for d in docs if d["kind"] == "SegtxnCluster")
    validate(cluster)
    assert cluster["spec"]["brokers"]["settings"]["publishBufferBytes"] == 64 * 1024**2
    values = tmp_path / "values.yaml"  # a YAML number reaches the template as a float
    values.write_text("cluster: {create: true, publishBufferBytes: 536870912}\n")
    out = helm("template", "rel", str(CHART), "--kube-version", KUBE_VERSION, "-f", str(values))
    cluster = next(d for d in load_all(out) if d["kind"] == "SegtxnCluster")
    validate(cluster)
    assert "publishBufferBytes: 536870912\n" in out  # not 5.36870912e+08
    default = template(helm, "cluster.create=true")  # absent: the brokers' default, no key
    cluster = next(d for d in default if d["kind"] == "SegtxnCluster")
    assert "publishBufferBytes" not in cluster["spec"]["brokers"]["settings"]


CONNECTION_LIMITS = ("maxConnections", "maxConnectionsPerIp", "idleTimeoutSeconds")


def connection_limits(docs: list[Doc]) -> tuple[dict[str, object], dict[str, object]]:
    """The limits the created SegtxnCluster (its brokers' settings) and TransactionCoordinator
    set, each validated against its CRD."""
    cluster = next(d for d in docs if d["kind"] == "SegtxnCluster")
    coordinators = next(d for d in docs if d["kind"] == "TransactionCoordinator")
    validate(cluster)
    validate(coordinators)
    settings, spec = cluster["spec"]["brokers"]["settings"], coordinators["spec"]
    return (
        {k: settings[k] for k in CONNECTION_LIMITS if k in settings},
        {k: spec[k] for k in CONNECTION_LIMITS if k in spec},
    )


def test_cluster_connection_limits_reach_the_brokers_and_the_coordinators(
    helm: Helm, tmp_path: Path
) -> None:
    sets = ("cluster.maxConnections=5000", "cluster.maxConnectionsPerIp=64")
    docs = template(helm, "cluster.create=true", *sets, "cluster.idleTimeoutSeconds=30")
    want = {"maxConnections": 5000, "maxConnectionsPerIp": 64, "idleTimeoutSeconds": 30}
    assert connection_limits(docs) == (want, want)
    values = tmp_path / "values.yaml"  # a YAML number reaches the template as a float
    values.write_text(
        "cluster: {create: true, maxConnections: 1000000, idleTimeoutSeconds: 1000000}\n"
    )
    out = helm("template", "rel", str(CHART), "--kube-version", KUBE_VERSION, "-f", str(values))
    assert "e+06" not in out  # printed whole: the CRD refuses a string
    want = {"maxConnections": 1000000, "idleTimeoutSeconds": 1000000}
    assert connection_limits(load_all(out)) == (want, want)
    values.write_text("cluster: {create: true, idleTimeoutSeconds: 2.5}\n")
    docs = template(helm, values=values)
    assert connection_limits(docs) == ({"idleTimeoutSeconds": 2.5}, {"idleTimeoutSeconds": 2.5})
    # absent (null): the servers' defaults, no field
    assert connection_limits(template(helm, "cluster.create=true")) == ({}, {})


def etcd_args(docs: list[Doc]) -> list[str]:
    etcd = next(d for d in docs if d["kind"] == "StatefulSet")
    args: list[str] = etcd["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


@pytest.mark.parametrize(
    ("sets", "flags"),
    [
        (
            ("etcd.autoCompaction.retention=30s", "etcd.quotaBackendBytes=8589934592"),
            ["periodic", "30s", "8589934592"],
        ),
        (  # a revision count is printed whole (not 1e+06), whether given as number or text
            ("etcd.autoCompaction.mode=revision", "etcd.autoCompaction.retention=1000000"),
            ["revision", "1000000", "4294967296"],
        ),
    ],
)
def test_etcd_compaction_values_become_its_flags(
    helm: Helm, sets: tuple[str, ...], flags: list[str]
) -> None:
    args = etcd_args(template(helm, *sets))
    names = ["--auto-compaction-mode", "--auto-compaction-retention", "--quota-backend-bytes"]
    assert [a.split("=", 1)[1] for a in args if a.split("=", 1)[0] in names] == flags


def test_etcd_revision_retention_from_a_values_file_is_printed_whole(
    helm: Helm, tmp_path: Path
) -> None:
    values = tmp_path / "values.yaml"  # a YAML number reaches the template as a float
    values.write_text("etcd:\n  autoCompaction: {mode: revision, retention: 2500000}\n")
    out = helm("template", "rel", str(CHART), "--kube-version", KUBE_VERSION, "-f", str(values))
    assert "--auto-compaction-retention=2500000" in etcd_args(load_all(out))


@pytest.mark.parametrize(
    ("sets", "complaint"),
    [
        (("etcd.replicas=2",), "etcd.replicas must be one of"),
        (("operator.replicas=0",), "operator.replicas"),
        (("image.tag=",), "image.tag"),
        (("nonsense=1",), "Additional property nonsense is not allowed"),
        (("etcd.storage.size=lots",), "etcd.storage.size"),
        (("cluster.retentionTimeSeconds=-2",), "cluster.retentionTimeSeconds"),
        (("cluster.retentionBytes=10G",), "cluster.retentionBytes"),
        (("cluster.headerWatch=everything",), "cluster.headerWatch"),
        (("cluster.publishBufferBytes=5177343",), "cluster.publishBufferBytes"),
        (("cluster.publishBufferBytes=256Mi",), "cluster.publishBufferBytes"),
        (("cluster.maxConnections=0",), "cluster.maxConnections"),
        (("cluster.maxConnections=1k",), "cluster.maxConnections"),
        (("cluster.maxConnectionsPerIp=0",), "cluster.maxConnectionsPerIp"),
        (("cluster.idleTimeoutSeconds=0",), "cluster.idleTimeoutSeconds"),
        (("cluster.idleTimeoutSeconds=31536001",), "cluster.idleTimeoutSeconds"),
        (("cluster.idleTimeoutSeconds=75s",), "cluster.idleTimeoutSeconds"),
        # etcd would read a bare number as hours in periodic mode: say 5h
        (("etcd.autoCompaction.retention=5",), "etcd.autoCompaction.retention"),
        # ...and a duration as a number of revisions in revision mode
        (
            ("etcd.autoCompaction.mode=revision", "etcd.autoCompaction.retention=5m"),
            "etcd.autoCompaction.retention",
        ),
        (("etcd.autoCompaction.mode=hourly",), "etcd.autoCompaction.mode"),
        (("etcd.quotaBackendBytes=4Gi",), "etcd.quotaBackendBytes"),
    ],
)
def test_values_schema_refuses_bad_values(
    helm: Helm, sets: tuple[str, ...], complaint: str
) -> None:
    args = ["lint", str(CHART)]
    for value in sets:
        args += ["--set", value]
    assert complaint in helm(*args, ok=False)


def test_cluster_without_etcd_fails_clearly(helm: Helm) -> None:
    out = helm(
        "template",
        "rel",
        str(CHART),
        "--kube-version",
        "1.30.0",
        "--set",
        "cluster.create=true",
        "--set",
        "etcd.enabled=false",
        ok=False,
    )
    assert "cluster.create needs etcd.enabled" in out


STORAGE_SIZES = ("etcd.storage.size", "cluster.storageSize")


@pytest.mark.parametrize("field", STORAGE_SIZES)
@pytest.mark.parametrize("size", ["0", "0Gi", "0.0Mi", "00Ti", "512m"])
def test_a_storage_size_of_nothing_is_refused(helm: Helm, field: str, size: str) -> None:
    """A volume of zero bytes (or of milli-bytes) is one no provisioner fills: the pods
    would stay Pending. Refused by ``helm lint`` as by the CRD. ``--set-string``: ``--set``
    would make ``0`` a number, refused for its type whatever the pattern."""
    out = helm("lint", str(CHART), "--set", "cluster.create=true", "--set-string",
               f"{field}={size}", ok=False)  # fmt: skip
    assert f"{field}: Does not match pattern" in out


@pytest.mark.parametrize("field", STORAGE_SIZES)
@pytest.mark.parametrize("size", ["1", "0.5Gi", "20Gi"])
def test_a_storage_size_above_zero_is_taken(helm: Helm, field: str, size: str) -> None:
    out = helm("lint", str(CHART), "--set", "cluster.create=true", "--set-string",
               f"{field}={size}")  # fmt: skip
    assert "0 chart(s) failed" in out


def test_the_storage_sizes_are_what_the_cluster_crd_takes() -> None:
    """``cluster.storageSize`` becomes the SegtxnCluster's ``brokers.storage.size``: the
    chart refuses what the API server would (and the same for etcd's volume)."""
    import json

    from tests.manifests.support import crd_schemas

    values = json.loads((CHART / "values.schema.json").read_text())
    brokers = crd_schemas()[("segtxn.io/v1alpha1", "SegtxnCluster")]["properties"]["spec"][
        "properties"
    ]["brokers"]["properties"]
    assert (
        values["definitions"]["storageSize"]["pattern"]
        == (brokers["storage"]["properties"]["size"]["pattern"])
    )
