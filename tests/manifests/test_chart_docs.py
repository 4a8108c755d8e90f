"""What the docs say about the chart holds for the chart: the object names they give, and
the ``helm template`` commands they show, run with the repository's own helm."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator

import pytest

from tests.manifests.support import CHART, KUBE_VERSION, ROOT, Doc, load_all
from tests.manifests.test_chart import Helm

DOCS = sorted((ROOT / "docs").glob("*.md"))
NAMED_IN = [
    *DOCS,
    ROOT / "README.md",
    CHART / "values.yaml",
    *sorted((CHART / "crds").glob("*.yaml")),
    *sorted((ROOT / "segtxn").rglob("*.py")),
]
FULLNAME = re.compile(r"<fullname>-([a-z0-9-]*[a-z0-9])")
RELEASE = re.compile(r"<release>-[A-Za-z0-9-]*")
# Every object the chart names after <fullname>, and the API the ServiceMonitors need.
EVERY_OBJECT = (
    "cluster.create=true",
    "metrics.dashboard.enabled=true",
    "metrics.serviceMonitor.enabled=true",
)
API_VERSIONS = ("monitoring.coreos.com/v1/ServiceMonitor",)


def commands(text: str) -> Iterator[str]:
    """The shell lines of the fenced ``sh`` blocks, continuation lines joined."""
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        yield from block.replace("\\\n", " ").splitlines()


def rendered(helm: Helm, release: str, *sets: str) -> list[Doc]:
    args = ["template", release, str(CHART), "-n", "segtxn", "--kube-version", KUBE_VERSION]
    for api in API_VERSIONS:
        args += ["--api-versions", api]
    for value in sets:
        args += ["--set", value]
    return load_all(helm(*args))


@pytest.mark.parametrize(
    ("release", "fullname"),
    [("segtxn", "segtxn"), ("prod", "prod-segtxn"), ("segtxn-prod", "segtxn-prod")],
)
def test_fullname_is_the_release_when_it_says_segtxn_else_release_segtxn(
    helm: Helm, release: str, fullname: str
) -> None:
    """The rule docs/kubernetes.md ("Names") gives once, and every other place relies on."""
    names = {d["metadata"]["name"] for d in rendered(helm, release)}
    assert {f"{fullname}-operator", f"{fullname}-etcd", f"{fullname}-etcd-client-tls"} <= names


def test_every_fullname_the_docs_give_is_an_object_the_chart_renders(helm: Helm) -> None:
    names = {d["metadata"]["name"] for d in rendered(helm, "rel", *EVERY_OBJECT)}
    said = {
        (path.relative_to(ROOT).as_posix(), suffix)
        for path in NAMED_IN
        for suffix in FULLNAME.findall(path.read_text())
    }
    assert said, "no <fullname>-... name found: the pattern no longer matches the docs"
    assert sorted((where, s) for where, s in said if f"rel-segtxn-{s}" not in names) == []


def test_no_other_placeholder_stands_for_the_fullname() -> None:
    """``<release>-...`` appears only where the rule itself is said (``<release>-segtxn``)."""
    wrong = [
        (path.relative_to(ROOT).as_posix(), found)
        for path in NAMED_IN
        for found in RELEASE.findall(path.read_text())
        if found != "<release>-segtxn"
    ]
    assert wrong == []


HELM_TEMPLATES = [
    (path.name, line)
    for path in DOCS
    for line in commands(path.read_text())
    if line.strip().startswith("helm template")
]


@pytest.mark.parametrize(("doc", "line"), HELM_TEMPLATES, ids=[c[1] for c in HELM_TEMPLATES])
def test_the_docs_helm_template_commands_run(helm: Helm, doc: str, line: str) -> None:
    """As written, from the repository's root, with the helm the tests use (3.6: a
    Kubernetes version must be given, as the docs say)."""
    words = shlex.split(line, comments=True)
    assert words[0] == "helm"
    # the docs' paths are from the repository's root, wherever pytest runs
    args = [str(ROOT / w) if (ROOT / w).exists() and "/" in w else w for w in words[1:]]
    assert load_all(helm(*args)), (doc, line)


def test_the_files_the_docs_commands_name_exist() -> None:
    """``-f PATH`` of every fenced command (``kubectl apply -f manifests/helm/segtxn/crds/``
    before an upgrade, ``docker build -f ...``): a path of the repository."""
    named = [
        (path.name, words[i + 1])
        for path in [*DOCS, ROOT / "README.md"]
        for line in commands(path.read_text())
        for words in [shlex.split(line, comments=True)]
        for i, word in enumerate(words[:-1])
        if word in ("-f", "--filename") and not words[i + 1].startswith(("-", "http"))
    ]
    assert ("kubernetes.md", "manifests/helm/segtxn/crds/") in named
    assert [(doc, p) for doc, p in named if not (ROOT / p).exists()] == []
