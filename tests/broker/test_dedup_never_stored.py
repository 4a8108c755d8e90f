"""What de-duplication knows was never stored, and where it does not know (it answers a
resend ``-1:-1`` then, "a duplicate, where unknown").

A producer's seq not above its highest stored, neither stored nor in flight, is refused
again on resend only when the broker can prove it was never stored: its refusal is
remembered, or every stored seq from below it up is known (the producer's recent
positions while loaded; after a recovery, the producer's entries the replay reads, from
its first one on). A seq further back stays unknown: stored perhaps.
"""

from __future__ import annotations

from segtxn.broker.dedup import RECENT_PER_PRODUCER, Deduplication, ProducerState
from segtxn.broker.entry import StoredMessage, encode_entry
from segtxn.ledger import LedgerSettings, ManagedLedger, MemoryLogStorage, Position
from segtxn.metastore import open_store
from segtxn.protocol.errors import ErrorName, ServerError

TOPIC = "persistent://acme/never/stored"
EVERY = 10


def test_a_seq_stays_known_as_never_stored_until_its_producer_stored_more_than_it_remembers() -> (
    None
):
    state = ProducerState(-1, 0)
    refusal = ServerError(ErrorName.TRANSACTION_CONFLICT, "ended")
    for seq in range(RECENT_PER_PRODUCER + 100):
        if seq == 50:
            state.refused(seq, refusal)
        elif seq != 60:  # never received
            state.stored(seq, Position(1, seq), 0)
        if seq == 200:
            assert state.never_stored(50) and state.never_stored(60)
            assert not state.never_stored(40)
    # the positions of 0..99 are forgotten: whether 60 was stored is not known any more
    assert state.known_from == 100 and not state.never_stored(60)
    assert state.never_stored(50) and state.refusals[50] is refusal  # remembered
    state.stored(RECENT_PER_PRODUCER + 200, Position(1, 0), 0)
    assert state.never_stored(RECENT_PER_PRODUCER + 150)


async def test_a_recovery_knows_a_producer_from_its_first_replayed_entry() -> None:
    """A crash after periodic snapshots: the replay starts after the 10th entry; "p"'s
    seqs from its first replayed one up are known (20, never received, was not stored),
    those before are not (3 may have been); "early" stored nothing the replay reads."""
    async with open_store("memory://") as store:
        ledger = await ManagedLedger.open(TOPIC, store, MemoryLogStorage(), LedgerSettings())
        try:
            dedup = Deduplication(TOPIC, store, EVERY)
            await dedup.recover(ledger)
            plan = [("early", 0), ("early", 1)] + [
                ("p", seq) for seq in range(2 * EVERY + 3) if seq not in (3, 2 * EVERY)
            ]
            for producer, seq in plan:
                position = await ledger.append(encode_entry(StoredMessage(producer, seq, 0, b"x")))
                if dedup.note_stored(producer, seq, position):
                    await dedup.snapshot()
            recovered = Deduplication(TOPIC, store, EVERY)
            await recovered.recover(ledger)
            p = recovered.state("p")
            assert p.last == 2 * EVERY + 2 and p.known_from == 9  # the 11th entry is p/9
            assert p.never_stored(2 * EVERY)
            assert not any(p.never_stored(seq) for seq in range(9))  # where unknown
            assert not any(p.never_stored(seq) for seq in range(9, 2 * EVERY))  # stored
            early = recovered.state("early")
            assert early.last == 1 and early.known_from == 2
            assert not early.never_stored(0) and not early.never_stored(1)
        finally:
            await ledger.close()
