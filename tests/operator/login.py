"""Kopf's login for the tests: the emulator's URL from the memo (no kubeconfig needed;
a registered login handler replaces Kopf's built-in ones)."""

from __future__ import annotations

from typing import Any

import kopf


@kopf.on.login(id="emulator")
def login(memo: Any, **_: Any) -> kopf.ConnectionInfo:
    connection = memo.get("connection")
    assert isinstance(connection, kopf.ConnectionInfo), "tests put the emulator's URL in memo"
    return connection
