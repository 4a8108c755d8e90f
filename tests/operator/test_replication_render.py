"""spec.brokers.replication as pure functions: what it renders (parsed by the real broker
CLI), which W/A the operator refuses, turning it off refused against what is applied, the
brokers' disruption budget, and the scale-down guard below W (no processes)."""

from __future__ import annotations

from typing import Any

import pytest

from segtxn.ledger.replicas import Replication
from segtxn.operator import render, replication, scaledown
from segtxn.operator.immutable import immutable_changes
from tests.manifests.support import crd_schemas, validate
from tests.operator.test_render import by_kind, config_for, expand, minimal, parse
from tests.operator.test_scaledown import Answers

API = "segtxn.io/v1alpha1"
STORE = "etcd://e:2379/r"
BEFORE_REPLICATION = {"storeUrl", "sessionTtlSeconds", "consumerHoldSeconds",
                      "autoCreateTopics", "retentionTimeSeconds", "retentionBytes"}  # fmt: skip
"""The brokers' ConfigMap keys before replication existed."""


def spec(replicas: int = 3, replication: str | None = None) -> dict[str, Any]:
    brokers: dict[str, Any] = {"replicas": replicas}
    if replication is not None:
        brokers["replication"] = replication
    return minimal("SegtxnCluster", {"metadataStore": {"url": STORE}, "brokers": brokers})


def broker_run(cluster: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(the broker command's parameters as the real CLI parses them, the ConfigMap data)."""
    objects = by_kind(render.render_cluster("demo", "segtxn", cluster))
    for obj in objects.values():
        validate(obj)
    config = config_for(objects, "StatefulSet/demo-broker")
    container = objects["StatefulSet/demo-broker"]["spec"]["template"]["spec"]["containers"][0]
    return parse(expand(container, config)), config


def test_replication_reaches_the_broker_command_line() -> None:
    params, config = broker_run(spec(replication="3/2"))
    assert params["replication"] == "3/2"
    assert Replication.parse(params["replication"]) == Replication(3, 2)
    assert config["replication"] == "3/2"


def test_without_replication_nothing_is_rendered_and_nothing_rolls() -> None:
    """Off, the brokers' ConfigMap and pod template are what they were before the field
    existed: an operator upgrade does not roll a cluster that does not use it."""
    params, config = broker_run(spec())
    assert params["replication"] is None
    assert set(config) == BEFORE_REPLICATION
    sts = by_kind(render.render_cluster("demo", "segtxn", spec()))["StatefulSet/demo-broker"]
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert not any("replication" in a for a in container["args"])
    assert "SEGTXN_REPLICATION" not in {e["name"] for e in container["env"]}


def test_turning_it_on_rolls_the_coordinators_too_with_their_v4_logs_replicated() -> None:
    """Coordinators keep their v4 transaction logs on the brokers' storage nodes when the
    brokers replicate, so a coordinator pod anywhere can take a v4 id over (before, v4
    transactions needed a shared volume, which the chart never gave them)."""
    off = by_kind(render.render_cluster("demo", "segtxn", spec()))
    on = by_kind(render.render_cluster("demo", "segtxn", spec(replication="3/2")))
    template = "StatefulSet/demo-broker"

    def hash_of(objects: dict[str, Any]) -> str:
        return str(objects[template]["spec"]["template"]["metadata"]["annotations"][
            render.CONFIG_HASH])  # fmt: skip

    assert hash_of(off) != hash_of(on)
    tc = minimal("TransactionCoordinator", {"clusterRef": "demo"})
    runs = []
    for cluster in (spec(), spec(replication="3/2")):
        objects = by_kind(render.render_coordinator("demo", "segtxn", tc, cluster))
        for obj in objects.values():
            validate(obj)
        deployment = objects["Deployment/demo-coordinator"]
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        config = config_for(objects, "Deployment/demo-coordinator")
        runs.append(parse(expand(container, config)))
    assert runs[0]["replication"] is None and runs[0]["data_dir"] is None  # no v4 there
    assert runs[1]["replication"] == "3/2"  # v4 on, logs on the brokers' nodes


@pytest.mark.parametrize(
    ("written", "replicas", "complaint"),
    [
        ("3/3", 3, "at most a majority"),
        ("2/2", 3, "at most a majority"),
        ("2/3", 3, "at most the write quorum"),
        ("3/2", 2, "raise replicas to at least 3, or lower W"),
        ("5/3", 4, "spec.brokers.replicas is 4"),
        ("3-2", 3, "write it W/A"),
        ("0/1", 3, "write it W/A"),
        ("03/2", 3, "write it W/A"),
    ],
)
def test_quorums_the_brokers_cannot_run_are_refused(
    written: str, replicas: int, complaint: str
) -> None:
    with pytest.raises(replication.InvalidReplication, match=complaint):
        replication.wanted(spec(replicas, written))


@pytest.mark.parametrize(("written", "replicas"), [("3/2", 3), ("2/1", 2), ("1/1", 1),
                                                   ("5/3", 7), ("4/2", 4)])  # fmt: skip
def test_quorums_the_brokers_run_are_accepted(written: str, replicas: int) -> None:
    parsed = replication.wanted(spec(replicas, written))
    assert parsed is not None and str(parsed) == written


def test_the_crd_pattern_is_the_operators_and_its_rules_are_there() -> None:
    """The API server checks the same W/A as the operator: the pattern is
    :data:`replication.PATTERN`; A <= W, 2A <= W + 1, W <= replicas and "never turned
    off" are CEL rules (kmock does not run CEL: the operator's own refusals are tested on
    it, tests/operator/test_replication.py)."""
    brokers = crd_schemas()[(API, "SegtxnCluster")]["properties"]["spec"]["properties"]["brokers"]
    assert brokers["properties"]["replication"]["pattern"] == replication.PATTERN
    assert "default" not in brokers["properties"]["replication"]  # off unless asked for
    rules = [v["rule"] for v in brokers["x-kubernetes-validations"]]
    assert rules[1] == "has(self.replication) || !has(oldSelf.replication)"
    quorum = rules[0]
    for part in ("!has(self.replication)", "<= int(self.replication.split('/')[0])",
                 "2 * int(self.replication.split('/')[1])", "self.replicas"):  # fmt: skip
        assert part in quorum


def test_turning_it_off_is_refused_against_what_is_applied() -> None:
    on = spec(replication="3/2")
    objects = by_kind(render.render_cluster("demo", "segtxn", on))
    config = config_for(objects, "StatefulSet/demo-broker")
    sts = objects["StatefulSet/demo-broker"]
    [change] = immutable_changes(config, sts, spec())
    assert (change.field, change.applied, change.wanted) == ("spec.brokers.replication", "3/2",
                                                             "off")  # fmt: skip
    message = change.message()
    assert message.startswith("spec.brokers.replication cannot be turned off (from '3/2'")
    assert "would become unreadable" in message and "Any W/A may be set" in message
    # On stays on with any W/A; off may be turned on; nothing applied: anything goes.
    assert immutable_changes(config, sts, spec(5, "5/3")) == []
    off_objects = by_kind(render.render_cluster("demo", "segtxn", spec()))
    off_config = config_for(off_objects, "StatefulSet/demo-broker")
    assert immutable_changes(off_config, off_objects["StatefulSet/demo-broker"], on) == []
    assert immutable_changes(None, None, spec()) == []


def valid_quorums(most: int = 9) -> list[Replication]:
    return [Replication(w, a) for w in range(1, most + 1) for a in range(1, w + 1)
            if 2 * a <= w + 1]  # fmt: skip


def test_the_brokers_budget_keeps_the_quorums_and_never_blocks_a_drain() -> None:
    """With W/A, ``k`` brokers down keep every replicated ledger writable (``W - k >= A``)
    and recoverable (``W - k >= W - A + 1``) while ``k <= min(W - A, A - 1)``; the budget
    is 1 for every W/A (the brief's ``min(1, W - A) if W - A >= 1 else 1``): within that
    bound wherever the bound is at least 1 (3/2 among them), and never 0 (a drain would
    wait for ever)."""
    for quorum in valid_quorums():
        w, a = quorum.write_quorum, quorum.ack_quorum
        budget = replication.max_unavailable(quorum)
        assert budget == (min(1, w - a) if w - a >= 1 else 1) == 1
        if min(w - a, a - 1) >= 1:
            assert w - budget >= a and w - budget >= w - a + 1, quorum
    pdb = by_kind(render.render_cluster("demo", "segtxn", spec(replication="3/2")))[
        "PodDisruptionBudget/demo-broker"
    ]
    assert pdb["spec"]["maxUnavailable"] == 1
    # A refused replication renders (the status timer renders refused specs too).
    assert replication.broker_budget(spec(2, "3/2")) == 1


async def test_a_scale_down_below_w_is_refused_finally_without_asking_the_brokers() -> None:
    answers = Answers({})
    verdict = await scaledown.check(answers, "c-broker", 4, 2, replication=Replication(3, 2))
    assert not verdict.allowed and verdict.final
    assert answers.asked == []
    assert "spec.brokers.replicas 4 -> 2 refused: replication 3/2" in verdict.message
    assert "Keep at least 3 brokers" in verdict.message
    # Down to W itself is the usual check (the brokers are asked, empty ones may go).
    verdict = await scaledown.check(answers, "c-broker", 4, 3, replication=Replication(3, 2))
    assert verdict.allowed and [b for b, _ in answers.asked] == ["c-broker-3"]


async def test_a_refused_scale_down_says_what_to_do_with_replication_too() -> None:
    answers = Answers({"c-broker-3": ["persistent://t/n/p"]}, stuck=frozenset({"c-broker-3"}))
    verdict = await scaledown.check(answers, "c-broker", 4, 3, replication=Replication(3, 2))
    assert not verdict.allowed and not verdict.final  # checked again: topics may go
    message = verdict.message
    assert "With replication 3/2 they were drained, but these stayed" in message
    assert "written before replication was turned on" in message
    assert "GET /admin/v2/brokers/c-broker-3/homes" in message
    assert "set spec.brokers.replicas back to 4" in message
    plain = await scaledown.check(answers, "c-broker", 4, 3)
    assert "ledgers are not replicated" in plain.message
    assert "GET /admin/v2/brokers/c-broker-3/homes" in plain.message


def test_the_repair_interval_reaches_the_broker_command_line_with_replication_only() -> None:
    """``settings.repairIntervalSeconds`` becomes the brokers' ``--repair-interval`` (parsed
    by the real CLI); without replication it renders nothing (the flag would be refused,
    and a cluster that does not replicate is not rolled for it)."""
    on = spec(replication="3/2")
    on["brokers"]["settings"]["repairIntervalSeconds"] = 5
    params, config = broker_run(on)
    assert params["repair_interval"] == 5.0
    assert config[replication.REPAIR_KEY] == "5"
    params, _ = broker_run(spec(replication="3/2"))
    assert params["repair_interval"] == 30.0  # absent: the brokers' default
    off = spec()
    off["brokers"]["settings"]["repairIntervalSeconds"] = 5
    params, config = broker_run(off)
    assert params["repair_interval"] == 30.0
    assert set(config) == BEFORE_REPLICATION
