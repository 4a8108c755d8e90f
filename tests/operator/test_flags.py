"""``segtxn operator``'s roll timeouts: flags and environment variables parsed once, at
start-up, into the settings the roll reads (Kopf itself not started: ``kopf.run`` is
replaced by a recorder; the flags are parsed by the real CLI)."""

from __future__ import annotations

import importlib
from typing import Any

import kopf
import pytest
from click.testing import CliRunner

from segtxn.cli.operator import operator
from segtxn.operator.rollstate import RollSettings


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(kopf, "run", lambda **kwargs: calls.append(kwargs))
    # The module, not the command of the same name the package exports.
    module = importlib.import_module("segtxn.cli.operator")
    monkeypatch.setattr(module, "_quiet_start_up_failures", lambda: None)
    return calls


def test_the_roll_timeouts_default_to_the_documented_values(runs: list[dict[str, Any]]) -> None:
    done = CliRunner().invoke(operator, ["--standalone", "-n", "segtxn"], env={})
    assert done.exit_code == 0, done.output
    assert runs[0]["memo"]["config"].roll == RollSettings(
        drain_timeout_s=300, evict_timeout_s=300, ready_timeout_s=600, retry_s=300
    )
    assert runs[0]["namespaces"] == ["segtxn"] and runs[0]["clusterwide"] is False
    # where the start-up check looks for the peering object (segtxn/operator/peering.py)
    assert runs[0]["memo"]["config"].namespaces == ("segtxn",)


def test_flags_and_environment_set_the_roll_timeouts(runs: list[dict[str, Any]]) -> None:
    done = CliRunner().invoke(
        operator,
        ["--standalone", "-n", "segtxn", "--roll-drain-timeout=42", "--roll-evict-timeout", "7.5"],
        env={"SEGTXN_ROLL_READY_TIMEOUT": "90", "SEGTXN_ROLL_RETRY": "30"},
    )
    assert done.exit_code == 0, done.output
    assert runs[0]["memo"]["config"].roll == RollSettings(
        drain_timeout_s=42, evict_timeout_s=7.5, ready_timeout_s=90, retry_s=30
    )


@pytest.mark.parametrize("value", ["0", "-5", "soon"])
def test_a_timeout_that_is_not_a_positive_number_is_refused(
    runs: list[dict[str, Any]], value: str
) -> None:
    done = CliRunner().invoke(operator, ["--standalone", "-A", f"--roll-evict-timeout={value}"])
    assert done.exit_code == 2
    assert "Invalid value for '--roll-evict-timeout'" in done.output
    assert runs == []
