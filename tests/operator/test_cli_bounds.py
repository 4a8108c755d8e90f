"""What a CRD accepts, the command it is rendered into accepts: every number field of the
SegtxnCluster, TransactionCoordinator and VerificationRun schemas, at its schema's
minimum and maximum, rendered with the operator's own functions and parsed by the real
``segtxn`` command (a value the CLI refuses is a pod that crash-loops).

The cases come from the schemas, not from a list: a new number field is covered as soon
as it exists. A field without a ``maximum`` (or ``minimum``) is fed a huge (or very
negative) value instead, which the CLI must then accept too. Where the CLI has an upper
bound, the schema's ``maximum`` must be exactly it (just above it is refused), unless the
CRD is deliberately stricter (:data:`STRICTER`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import click
import pytest

from segtxn.cli.commands import main
from segtxn.operator import render
from segtxn.operator.sparkapp import CHECK_SCRIPT, render_run
from tests.manifests.support import crd_schemas
from tests.operator.test_render import API, expand, minimal, parse

HUGE = 10**12
BASES: dict[str, dict[str, Any]] = {
    # replication on, so that what is rendered only with it (--repair-interval) is too
    "SegtxnCluster": {"metadataStore": {"url": "etcd://e:2379"}, "brokers": {"replication": "3/2"}},
    "TransactionCoordinator": {"clusterRef": "demo"},
    "VerificationRun": {"clusterRef": "demo"},
}
STRICTER = {
    ("TransactionCoordinator", "coordinatorIds"): "256: the CRD's own cap (the CLI takes 1024)",
}
"""Fields whose ``maximum`` is below the CLI's bound on purpose, and why."""

Path = tuple[str, ...]


def numbers(schema: Mapping[str, Any], path: Path = ()) -> Iterator[tuple[Path, Mapping[str, Any]]]:
    """Every integer or number field under ``schema``'s properties (not inside lists or
    maps: none of those is rendered into a flag)."""
    for name, child in schema.get("properties", {}).items():
        if child.get("type") in ("integer", "number"):
            yield (*path, name), child
        elif child.get("type") == "object":
            yield from numbers(child, (*path, name))


def extremes(node: Mapping[str, Any]) -> list[tuple[str, float]]:
    """(which end, a value the schema accepts there)."""
    integer = node["type"] == "integer"
    low, high = node.get("minimum"), node.get("maximum")
    if low is not None and node.get("exclusiveMinimum"):
        low += 1 if integer else 1e-6
    if high is not None and node.get("exclusiveMaximum"):
        high -= 1 if integer else 1e-6
    return [
        ("minimum" if low is not None else "no minimum", -HUGE if low is None else low),
        ("maximum" if high is not None else "no maximum", HUGE if high is None else high),
    ]


def with_value(kind: str, path: Path, value: float) -> dict[str, Any]:
    spec = copy.deepcopy(BASES[kind])
    here = spec
    for name in path[:-1]:
        here = here.setdefault(name, {})
    here[path[-1]] = value
    return minimal(kind, spec)


def _verify(args: list[str]) -> dict[str, Any]:
    group = main.commands[args[0]]
    assert isinstance(group, click.Group)
    with group.commands[args[1]].make_context(args[1], args[2:]) as ctx:
        return dict(ctx.params)


def _container(objects: list[render.Obj], kind: str) -> tuple[Mapping[str, Any], dict[str, str]]:
    workload = next(o for o in objects if o["kind"] == kind)
    config = render.config_ref(workload)
    data = next(o["data"] for o in objects if o["metadata"]["name"] == config)
    return workload["spec"]["template"]["spec"]["containers"][0], data


def run_commands(kind: str, spec: dict[str, Any]) -> None:
    """Render ``spec`` as the operator does and parse every ``segtxn`` command it yields.

    Raises:
        click.ClickException: the CLI refuses one.
    """
    tc = minimal("TransactionCoordinator", BASES["TransactionCoordinator"])
    cluster = minimal("SegtxnCluster", BASES["SegtxnCluster"])
    if kind == "SegtxnCluster":
        cluster = spec
    if kind == "TransactionCoordinator":
        tc = spec
    if kind == "VerificationRun":
        _, pod = render_run("r1", "ns", "uid", spec, "http://demo-broker.ns.svc:8080")
        _verify(pod["spec"]["initContainers"][0]["args"])
        args = pod["spec"]["containers"][0]["args"]
        _verify(args[args.index(CHECK_SCRIPT) + 1 :])
        return
    for objects, workload in (
        (render.render_cluster("demo", "ns", cluster), "StatefulSet"),
        (render.render_coordinator("tc", "ns", tc, cluster), "Deployment"),
    ):
        parse(expand(*_container(objects, workload)))


def cases() -> Iterator[Any]:
    for kind in BASES:
        spec = crd_schemas()[(API, kind)]["properties"]["spec"]
        for path, node in numbers(spec):
            for end, value in extremes(node):
                yield pytest.param(kind, path, value, id=f"{kind}.{'.'.join(path)}:{end}")


@pytest.mark.parametrize(("kind", "path", "value"), list(cases()))
def test_the_cli_accepts_what_the_schema_does(kind: str, path: Path, value: float) -> None:
    spec = with_value(kind, path, value)
    try:
        run_commands(kind, spec)
    except click.ClickException as e:
        pytest.fail(f"the CRD accepts {'.'.join(path)}: {value}, the CLI refuses it: {e}")


def refused(call: Callable[[], None]) -> bool:
    try:
        call()
    except click.ClickException:
        return True
    return False


@pytest.mark.parametrize(
    ("kind", "path", "node"),
    [
        pytest.param(kind, path, node, id=f"{kind}.{'.'.join(path)}")
        for kind in BASES
        for path, node in numbers(crd_schemas()[(API, kind)]["properties"]["spec"])
        if "maximum" in node
    ],
)
def test_a_maximum_the_cli_has_is_the_schemas(
    kind: str, path: Path, node: Mapping[str, Any]
) -> None:
    """Just above the schema's maximum, the CLI refuses too, where it has a bound at all
    (``maximum`` is the CLI's, not an accident below it)."""
    if not refused(lambda: run_commands(kind, with_value(kind, path, HUGE))):
        return  # not rendered into a bounded flag: the maximum is the CRD's own
    above = node["maximum"] + (1 if node["type"] == "integer" else node["maximum"] * 1e-9)
    if (kind, path[-1]) in STRICTER:
        assert not refused(lambda: run_commands(kind, with_value(kind, path, above)))
    else:
        assert refused(lambda: run_commands(kind, with_value(kind, path, above)))
