"""The servers' connection limits in the custom resources, rendered into their flags.

Brokers and coordinators each hold at most ``--max-connections`` connections at once (by
default half their open-files limit), optionally at most ``--max-connections-per-ip`` from
one address (none by default), and close a connection idle for ``--idle-timeout`` seconds
(75 by default): :mod:`segtxn.connlimits`. The resources name them ``maxConnections``,
``maxConnectionsPerIp`` and ``idleTimeoutSeconds``, in two places:

- the brokers': ``spec.brokers.settings`` of the SegtxnCluster. Like the brokers' other
  settings they go through the cluster's ConfigMap (:func:`config_data`), read into the
  command line from the environment (:func:`broker_flags`): the ConfigMap's hash in the
  pod template is what makes the operator roll the brokers (:mod:`.rolling`, one at a
  time; their StatefulSet is ``OnDelete``), and the coordinators' ConfigMap does not hold
  them (:data:`.render.COORDINATOR_CONFIG`): a broker's limit rolls no coordinator.
- the coordinators': the spec of the TransactionCoordinator, beside their other flags
  (``defaultTimeoutSeconds``…): literal flags (:func:`coordinator_args`). They are not
  taken from the cluster, so their change does not wait for the cluster's roll
  (:mod:`.ordering`): the coordinators' handler applies the new pod template and the
  Deployment replaces one coordinator at a time, the new one ready before the old goes.

A field absent (or null) renders nothing: no ConfigMap key, no env, no flag, so the servers
run with their own default, and an operator upgrade rolls no server of a resource that does
not set one. The CRDs bound each as the servers' command line does (counts of at least 1,
an idle timeout of 1 s to a year); tests/operator/test_cli_bounds.py parses both ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Limit:
    """One limit's field: its server flag and the brokers' env var that carries it."""

    flag: str
    env: str
    integer: bool

    def text(self, value: Any) -> str:
        """``value`` as the flag takes it: an integer written whole (the CRD admits only
        integers there), a number as Python writes it (``30.5``, ``75``)."""
        return str(int(value)) if self.integer else str(value)


MAX_CONNECTIONS = "maxConnections"
MAX_PER_IP = "maxConnectionsPerIp"
IDLE_TIMEOUT = "idleTimeoutSeconds"
FIELDS = {
    MAX_CONNECTIONS: Limit("--max-connections", "SEGTXN_MAX_CONNECTIONS", integer=True),
    MAX_PER_IP: Limit("--max-connections-per-ip", "SEGTXN_MAX_CONNECTIONS_PER_IP", integer=True),
    IDLE_TIMEOUT: Limit("--idle-timeout", "SEGTXN_IDLE_TIMEOUT", integer=False),
}
"""Each field (its name in the resources and the brokers' ConfigMap key), in the order its
flag is rendered."""


def config_data(settings: Mapping[str, Any]) -> dict[str, str]:
    """The brokers' ConfigMap entries for the limits ``settings`` (``spec.brokers.settings``)
    sets: only those, keyed by field name."""
    return {
        name: limit.text(settings[name])
        for name, limit in FIELDS.items()
        if settings.get(name) is not None
    }


def broker_flags(config: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(argument, env var, ConfigMap key) for each limit the brokers' ConfigMap data
    ``config`` holds: the argument reads the env var (``--max-connections=$(VAR)``), which
    the renderer fills from that key."""
    return [
        (f"{limit.flag}=$({limit.env})", limit.env, name)
        for name, limit in FIELDS.items()
        if name in config
    ]


def coordinator_args(spec: Mapping[str, Any]) -> list[str]:
    """The coordinators' flags for the limits a TransactionCoordinator's ``spec`` sets."""
    return [
        f"{limit.flag}={limit.text(spec[name])}"
        for name, limit in FIELDS.items()
        if spec.get(name) is not None
    ]
