"""The operator's RBAC in the chart is exactly what it calls: every request the operator
sends is granted, and every grant is used.

What the operator sends is known twice: declared (``segtxn/operator/kube.py``'s ``CALLS``,
which its client enforces, plus Kopf's own requests, listed here from Kopf's clients) and
observed (an operator run against the emulated API server, every request recorded and
turned into the RBAC verb the API server would check). The chart's rules must equal the
declared set, and cover everything observed. Namespaced by default: a Role in the release's
namespace and the operator told to watch only that one; cluster-wide only when asked."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import kopf
import pytest

from segtxn.operator import kube
from segtxn.operator.handlers import OperatorConfig
from segtxn.operator.rollstate import RollSettings
from tests.manifests.support import (
    CHART,
    KUBE_VERSION,
    Doc,
    helm,
    kinds,
    operator_roles,
    template,
    validate,
)
from tests.manifests.test_chart import Helm
from tests.operator.emulator import NS, Sent, emulator, operator
from tests.operator.fakebrokers import serving
from tests.operator.support import WAIT_S, statefulset_rolled, status
from tests.operator.test_rolling import (
    change_image,
    each_replaced,
    fake_brokers,
    running,
    watch,
)
from tests.waiting import wait_until

__all__ = ["helm"]  # the fixture

Grant = tuple[str, str, str]
"""(API group, resource or resource/subresource, verb)."""

GROUPS = {
    "SegtxnCluster": ("segtxn.io", "segtxnclusters"),
    "TransactionCoordinator": ("segtxn.io", "transactioncoordinators"),
    "ScalableTopic": ("segtxn.io", "scalabletopics"),
    "VerificationRun": ("segtxn.io", "verificationruns"),
    "StatefulSet": ("apps", "statefulsets"),
    "Deployment": ("apps", "deployments"),
    "ConfigMap": ("", "configmaps"),
    "Service": ("", "services"),
    "PodDisruptionBudget": ("policy", "poddisruptionbudgets"),
    "Pod": ("", "pods"),
    "Secret": ("", "secrets"),
    "Certificate": ("cert-manager.io", "certificates"),
    "Issuer": ("cert-manager.io", "issuers"),
    "KopfPeering": ("kopf.dev", "kopfpeerings"),
    "ClusterKopfPeering": ("kopf.dev", "clusterkopfpeerings"),
}
OURS = ("segtxnclusters", "transactioncoordinators", "scalabletopics", "verificationruns")
KOPF: set[Grant] = {
    # Kopf watches each handled resource (a LIST, then a WATCH from its resourceVersion)
    # and patches it (finalizers, annotations) and its status subresource; it posts
    # events; it GETs no single object, PUTs and DELETEs nothing.
    *(("segtxn.io", r, verb) for r in OURS for verb in ("list", "watch", "patch")),
    *(("segtxn.io", f"{r}/status", "patch") for r in OURS),
    ("", "events", "create"),
}
OWNERS: set[Grant] = {
    # Not a request: the OwnerReferencesPermissionEnforcement admission plugin requires it
    # of whoever sets an owner reference with blockOwnerDeletion (kopf.adopt does) on
    # children of these three.
    ("segtxn.io", "segtxnclusters/finalizers", "update"),
    ("segtxn.io", "transactioncoordinators/finalizers", "update"),
    ("segtxn.io", "verificationruns/finalizers", "update"),
}


SECURED: set[Grant] = {
    # Sent only for a cluster with spec.security on: its Secrets read, and created (a
    # server-side apply) when missing or due; cert-manager's objects in that mode. Each is
    # exercised by tests/operator/test_security.py, which checks it is sent and granted.
    ("", "secrets", "get"),
    ("", "secrets", "create"),
    ("", "secrets", "patch"),
    *(("cert-manager.io", r, v) for r in ("certificates", "issuers") for v in ("create", "patch")),
}


def peering(cluster_wide: bool) -> set[Grant]:
    """Kopf's peering: the namespaced objects in each watched namespace, or the cluster
    one when it watches every namespace; Kopf lists, watches and patches them, and the
    operator's start-up check GETs its own (kube.CALLS has both kinds: one is used)."""
    plural = "clusterkopfpeerings" if cluster_wide else "kopfpeerings"
    return {("kopf.dev", plural, verb) for verb in ("get", "list", "watch", "patch")}


def declared(cluster_wide: bool = False) -> set[Grant]:
    mine = {
        (GROUPS[kind][0], GROUPS[kind][1] + (f"/{sub}" if sub else ""), verb)
        for verb, kind, sub in kube.CALLS
        if kind not in kube.PEERING_KINDS
    }
    return mine | KOPF | OWNERS | peering(cluster_wide)


def grants(rules: Iterable[Mapping[str, Any]]) -> set[Grant]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def operator_args(docs: list[Doc]) -> list[str]:
    deployment = next(d for d in docs if d["kind"] == "Deployment" and "operator" in
                      d["metadata"]["name"])  # fmt: skip
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_by_default_a_role_in_the_release_namespace_grants_exactly_what_is_called(
    helm: Helm,
) -> None:
    docs = template(helm)
    assert "ClusterRole" not in kinds(docs) and "ClusterRoleBinding" not in kinds(docs)
    [role] = operator_roles(docs)
    [binding] = [d for d in docs if d["kind"] == "RoleBinding"
                 and d["roleRef"]["name"] == role["metadata"]["name"]]  # fmt: skip
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "segtxn"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}  # fmt: skip
    assert grants(role["rules"]) == declared()
    args = operator_args(docs)
    assert [a for a in args if "namespace" in a] == ["--namespace=segtxn"]


def test_listed_namespaces_get_a_role_each_and_only_they_are_watched(helm: Helm) -> None:
    docs = template(helm, "operator.watchNamespaces={team-a,team-b}")
    roles = operator_roles(docs)
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert all(grants(r["rules"]) == declared() for r in roles)
    assert "ClusterRole" not in kinds(docs)
    args = operator_args(docs)
    assert [a for a in args if "namespace" in a] == ["--namespace=team-a", "--namespace=team-b"]


def test_cluster_wide_is_an_opt_in_cluster_role_with_the_same_rules(helm: Helm) -> None:
    docs = template(helm, "operator.clusterWide=true")
    assert operator_roles(docs) == []
    [role] = [d for d in docs if d["kind"] == "ClusterRole"]
    assert grants(role["rules"]) == declared(cluster_wide=True)
    assert "--all-namespaces" in operator_args(docs)
    for doc in docs:
        validate(doc)


def test_cluster_wide_and_listed_namespaces_are_refused_together(helm: Helm) -> None:
    out = helm("template", "rel", str(CHART), "--kube-version", KUBE_VERSION,
               "--set", "operator.clusterWide=true", "--set", "operator.watchNamespaces={a}",
               ok=False)  # fmt: skip
    assert "leave operator.watchNamespaces empty" in out


def test_the_grants_hold_no_wildcard_delete_or_secret_listing(helm: Helm) -> None:
    [role] = operator_roles(template(helm))
    every = grants(role["rules"])
    assert not [g for g in every if "*" in g]
    assert not [g for g in every if g[2] in ("delete", "deletecollection", "escalate", "bind")]
    assert not [g for g in every if g[1] == "persistentvolumeclaims"]
    # Secrets by name only (a secured cluster's own): never listed or watched.
    assert {g[2] for g in every if g[1] == "secrets"} == {"get", "create", "patch"}
    assert ("", "pods", "list") not in every and ("", "pods", "get") in every


def verbs(sent: Sent) -> list[str]:
    """The RBAC verbs the API server checks for a request (a server-side apply of an
    object that does not exist yet creates it: ``create`` too)."""
    if sent.method == "GET":
        return ["watch"] if sent.watching else ["get"] if sent.named else ["list"]
    if sent.method == "PATCH":
        return ["patch", "create"] if sent.apply and not sent.existed else ["patch"]
    return [{"POST": "create", "PUT": "update", "DELETE": "delete"}[sent.method]]


def observed(requests: Iterable[Sent]) -> set[Grant]:
    return {
        (sent.group, sent.plural + (f"/{sent.subresource}" if sent.subresource else ""), verb)
        for sent in requests
        for verb in verbs(sent)
    }


@pytest.mark.timeout(120)
async def test_what_the_operator_sends_is_granted_and_every_call_is_exercised() -> None:
    """A cluster with coordinators, a topic, a roll with its drains and evictions and then
    the coordinators' turn, with peering on: every request recorded; each must be granted
    by the default Role."""
    fake = fake_brokers()
    async with serving(fake), emulator() as emu:
        emu.requests = []
        watch(emu, fake)
        settings = RollSettings(drain_timeout_s=30, ready_timeout_s=60, retry_s=3600)
        memo = kopf.Memo(config=OperatorConfig(broker_url=fake.url, roll=settings,
                                               coordinator_url="http://127.0.0.1:1",
                                               namespaces=(NS,)))  # fmt: skip
        code, body = await emu.call("POST", f"/apis/kopf.dev/v1/namespaces/{NS}/kopfpeerings",
                                    {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering",
                                     "metadata": {"name": "segtxn"}})  # fmt: skip
        assert code in (200, 201), body
        async with operator(emu, memo, standalone=False, peering_name="segtxn", priority=1):
            await running(emu, replication="3/2")
            await emu.create("TransactionCoordinator", "demo", {"clusterRef": "demo"})
            await wait_until(lambda: emu.get("apps/v1/deployments", "demo-coordinator")
                             is not None, timeout=WAIT_S, what="the coordinators")  # fmt: skip
            await emu.create("ScalableTopic", "orders", {"clusterRef": "demo", "tenant": "t",
                             "namespace": "n", "topic": "orders"})  # fmt: skip
            await change_image(emu, "segtxn:0.2.0", "r2")
            await each_replaced(emu, fake)
            await statefulset_rolled(emu)  # then the coordinators' turn reads and applies them

            def coordinators_applied() -> bool:
                found = emu.get("apps/v1/deployments", "demo-coordinator") or {}
                containers = found.get("spec", {}).get("template", {}).get("spec", {})
                return bool(containers.get("containers", [{}])[0].get("image") == "segtxn:0.2.0")

            await wait_until(coordinators_applied, timeout=WAIT_S, what="the coordinators' turn")
            await wait_until(lambda: bool(status(emu, "ScalableTopic", "orders")),
                             timeout=WAIT_S, what="the topic's status")  # fmt: skip
            # A verification run: its driver pod applied, its phase followed (a status
            # patch of the operator's own once the pod is read).
            await emu.create("VerificationRun", "r1", {"clusterRef": "demo"})
            await wait_until(lambda: status(emu, "VerificationRun", "r1").get("reason")
                             == "Starting", timeout=WAIT_S, what="the run followed")  # fmt: skip
        seen = observed(emu.requests)
    role = declared()
    assert seen - role == set(), "sent but not granted"
    # Every grant is used: none is there "just in case" (the finalizers are not a
    # request, see OWNERS; a secured cluster's, SECURED, in test_security.py).
    assert role - seen - OWNERS - SECURED == set(), "granted but never sent"
