"""The storage node's sweep: replicas that no ledger's placement names any more.

Some replicas outlive their use: a deletion (a trim, a deleted topic) that this node
missed while it was away; the copy of a recovery or a repair that lost its race; the
empty replicas of a create that failed, when its writer could not discard them at once
(:meth:`~segtxn.ledger.replicas.node.ReplicaNode.discard`: a node that did not answer, a
replica another create claimed too); the copy a repair replaced after this node came
back. Nothing else ever removes them, so each node sweeps its own.

A replica here (``<broker id>@<instance>``: ``member``) is garbage when its managed
ledger's metadata record is gone, or the record does not list this member among the
replicas of that ledger id — unless the id is at or past the record's ``next_ledger_id``
(the ledger its owner is creating, or will create next and may reuse). Being careful:

- only replicas whose files (the replica and its fence) have not been modified for
  ``grace_s`` are candidates: a copy being made is appended to, a create touches a
  reused replica, and a writer names a replica in the store right after creating it, so
  anything in use is young (a repair gives up rather than name a copy older than half the
  grace: :mod:`segtxn.ledger.replicas.repair`);
- the record is read right before its replicas are removed, and each removal re-checks,
  under the replica's lock, that its files are still that old and no read is using it.

A record that cannot be decoded, or a store that does not answer, removes nothing. A
replica that cannot be removed (its volume refuses: permissions, an I/O error) is left and
said once (:func:`~segtxn.ledger.errors.report_once`: every round meets it until an
operator acts), and the sweep goes on with the others: raising there stopped every round
at the same replica, and the ones after it were never removed.
"""

from __future__ import annotations

import itertools
import logging
import time

import msgspec

from segtxn.ledger.errors import DeleteFailed, report_once
from segtxn.ledger.metadata import LedgerMetadata, decode, metadata_key
from segtxn.ledger.replicas.members import Member
from segtxn.ledger.replicas.node import ReplicaNode
from segtxn.metastore import MetadataStore

log = logging.getLogger(__name__)


async def sweep(
    node: ReplicaNode, store: MetadataStore, member: Member, *, grace_s: float
) -> list[tuple[str, int]]:
    """Remove the replicas on ``node`` (known to placements as ``member``) that no
    placement names and that were left alone for ``grace_s``; returns them.

    Raises:
        MetadataStoreError: the store failed (what was removed before stays removed).
    """
    before_ns = time.time_ns() - int(grace_s * 1e9)
    candidates = await node.run(node.untouched, before_ns)
    removed: list[tuple[str, int]] = []
    for name, group in itertools.groupby(candidates, key=lambda c: c[0]):
        record = await store.get(metadata_key(name))
        try:
            meta = None if record is None else decode(record.value)
        except msgspec.DecodeError as e:
            log.warning("replica sweep: the record of %s cannot be read (%s); keeping it", name, e)
            continue
        for _, ledger_id in group:
            if named(meta, ledger_id, member):
                continue
            try:
                if await node.run(node.remove_untouched, name, ledger_id, before_ns):
                    removed.append((name, ledger_id))
            except DeleteFailed as e:
                report_once(
                    log, e, "replica sweep on %s: ledger %d of %s is left: %s",
                    member, ledger_id, name, e,
                )  # fmt: skip
    if removed:
        log.info(
            "replica sweep on %s: removed %d replicas no placement names (%s)",
            member,
            len(removed),
            ", ".join(f"ledger {i} of {n}" for n, i in removed[:20])
            + (", ..." if len(removed) > 20 else ""),
        )
    return removed


def named(meta: LedgerMetadata | None, ledger_id: int, member: Member) -> bool:
    """Whether ``meta`` (None: no record) still needs ``member``'s replica of the ledger."""
    if meta is None:
        return False
    if ledger_id >= meta.next_ledger_id:
        return True
    return any(i.id == ledger_id and str(member) in i.replicas for i in meta.ledgers)
