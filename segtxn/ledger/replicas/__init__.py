"""Replicated ledgers: each entry on an ensemble of storage nodes (issue 17's first step).

:mod:`~segtxn.ledger.replicas.node` is a storage node's side (replica files, fencing,
identity); :mod:`~segtxn.ledger.replicas.wire` carries it over HTTP;
:mod:`~segtxn.ledger.replicas.quorum` writes one ledger to its ensemble;
:mod:`~segtxn.ledger.replicas.storage` creates and recovers them (the ``LogStorage``);
:mod:`~segtxn.ledger.replicas.policy` is how many copies (``--replication W/A``);
:mod:`~segtxn.ledger.replicas.repair` re-replicates closed ledgers that lost copies, and
:mod:`~segtxn.ledger.replicas.sweep` removes the replicas no placement names.
"""

from segtxn.ledger.replicas.members import (
    LocalReplica,
    Member,
    Nodes,
    Replica,
    ReplicaBehind,
    ReplicaUnavailable,
)
from segtxn.ledger.replicas.node import ReplicaFenced, ReplicaGap, ReplicaNode, WrongInstance
from segtxn.ledger.replicas.policy import Replication, check_quorums
from segtxn.ledger.replicas.quorum import ReplicatedLog
from segtxn.ledger.replicas.repair import (
    Census,
    CopyState,
    Outcome,
    RepairSettings,
    repair_ledger,
)
from segtxn.ledger.replicas.storage import ReplicatedLogStorage, widen_default_executor
from segtxn.ledger.replicas.sweep import sweep
from segtxn.ledger.replicas.wire import HttpReplica, replica_routes

__all__ = [
    "Census",
    "CopyState",
    "HttpReplica",
    "LocalReplica",
    "Member",
    "Nodes",
    "Outcome",
    "RepairSettings",
    "Replica",
    "ReplicaBehind",
    "ReplicaFenced",
    "ReplicaGap",
    "ReplicaNode",
    "ReplicaUnavailable",
    "ReplicatedLog",
    "ReplicatedLogStorage",
    "Replication",
    "WrongInstance",
    "check_quorums",
    "repair_ledger",
    "replica_routes",
    "sweep",
    "widen_default_executor",
]
