"""The Helm chart with a real helm: lint, template, and every rendered object validated."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.manifests.support import (
    CHART,
    KUBE_VERSION,
    ROOT,
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
    assert kinds(docs).count("CustomResourceDefinition") == 5


def test_default_install(helm: Helm) -> None:
    docs = template(helm)
    assert kinds(docs) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
        "Service",
        "ServiceAccount",
        "StatefulSet",
    ]
    etcd = next(d for d in docs if d["kind"] == "StatefulSet")
    assert etcd["spec"]["replicas"] == 3
    args = etcd["spec"]["template"]["spec"]["containers"][0]["args"]
    cluster = next(a for a in args if a.startswith("--initial-cluster="))
    assert cluster.count("=http://") == 3  # every member named in the initial cluster
    # etcd keeps every revision until compacted: five minutes of history, a 4 GiB quota
    assert "--auto-compaction-mode=periodic" in args
    assert "--auto-compaction-retention=5m" in args
    assert "--quota-backend-bytes=4294967296" in args
    pdb = next(d for d in docs if d["kind"] == "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 2  # a quorum of 3 survives voluntary disruption
    operator = next(d for d in docs if d["kind"] == "Deployment")
    op_args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--all-namespaces" in op_args and "--peering=segtxn" in op_args


def test_operator_rbac_is_least_privilege(helm: Helm) -> None:
    docs = template(helm)
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    verbs = {v for rule in role["rules"] for v in rule["verbs"]}
    assert "*" not in verbs and "escalate" not in verbs and "bind" not in verbs
    resources = {r for rule in role["rules"] for r in rule["resources"]}
    assert "*" not in resources
    assert not {"secrets", "persistentvolumeclaims"} & resources
    # The operator only creates what it renders; it deletes nothing but a broker's pod (how
    # it rolls the OnDelete StatefulSet), reads pods one by one (no list, watch or
    # eviction), and replaces (PUT) nothing but the owners' finalizers (docs/kubernetes.md,
    # "RBAC").
    own = next(r for r in role["rules"] if "scalabletopics" in r["resources"])
    assert "create" not in own["verbs"]
    assert "deletecollection" not in verbs
    pods = [r for r in role["rules"] if "pods" in r["resources"]]
    assert pods == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "delete"]}]
    deletes = [r["resources"] for r in role["rules"] if "delete" in r["verbs"]]
    assert deletes == [["pods"]]
    updates = [r["resources"] for r in role["rules"] if "update" in r["verbs"]]
    assert updates == [["segtxnclusters/finalizers", "transactioncoordinators/finalizers"]]
    kinds_owned = ["statefulsets", "deployments", "services", "configmaps", "poddisruptionbudgets"]
    children = {
        r: sorted(rule["verbs"])
        for rule in role["rules"]
        for r in rule["resources"]
        if r in kinds_owned
    }
    assert children == {r: ["create", "get", "patch"] for r in kinds_owned}


def test_rbac_grants_what_the_operator_code_calls() -> None:
    """segtxn/operator talks to Kubernetes through kube.py only (Kopf does the rest, with
    GET, POST and PATCH): GET is get, and its one PATCH, a server-side apply, is patch, or
    create when the child does not exist yet; the chart grants exactly get, create and
    patch on the children. Its one DELETE is of a Pod (the rolling restart), the only
    resource the chart lets it delete; there is no PUT to grant."""
    source = "\n".join(p.read_text() for p in (ROOT / "segtxn" / "operator").glob("*.py"))
    methods = set(re.findall(r'_call\(\s*"([A-Z]+)"', source))
    assert methods == {"GET", "PATCH", "DELETE"}
    assert "application/apply-patch+yaml" in source
    assert re.findall(r'_call\("DELETE", self\._url\("v1", "(\w+)"', source) == ["Pod"]
    assert not re.search(r'"PUT"', source)


def test_namespaced_operator_gets_roles_not_cluster_rules(helm: Helm) -> None:
    docs = template(helm, "operator.watchNamespaces={team-a,team-b}")
    roles = [d for d in docs if d["kind"] == "Role"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:  # the same rules as cluster-wide: delete pods only, finalizers update
        deletes = [r["resources"] for r in role["rules"] if "delete" in r["verbs"]]
        assert deletes == [["pods"]]
        assert any("segtxnclusters/finalizers" in rule["resources"] for rule in role["rules"])
    cluster_role = next(d for d in docs if d["kind"] == "ClusterRole")
    assert [r["resources"] for r in cluster_role["rules"]] == [["customresourcedefinitions"]]
    operator = next(d for d in docs if d["kind"] == "Deployment")
    args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--all-namespaces" not in args


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
