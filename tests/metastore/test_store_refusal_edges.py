"""The metadata store where it refuses or races, each failing before its fix (a review):
``delete_range`` racing a sequential put (its counter was reset under a surviving key).
"""

from __future__ import annotations

import asyncio

from segtxn.metastore import keys as K
from tests.metastore.conftest import MakeStore
from tests.metastore.test_store_edges import _faults

# ------------------------------------------- delete_range never resets a counter under a key


async def test_delete_range_keeps_the_counter_of_a_put_that_survives_it(
    make_store: MakeStore,
) -> None:
    """delete_range removed the records, then, in a second and unconditional step, the
    prefix's sequence counter. A sequential put between the two survived while its
    counter went, so the next sequential put was numbered 1: below the survivor."""
    writer, deleter = make_store(), make_store()
    for i in range(3):
        await writer.put("/sq/", f"{i}".encode(), sequential=True)
    # park the deleter once its records are gone, before it reads the counters
    parked = _faults(deleter).hold("range", key_prefix=K.SEQUENCE_ROOT, before=True)
    deleting = asyncio.create_task(deleter.delete_range("/sq/"), name="delete-range")
    await parked.wait_for(1)
    assert (await writer.list_prefix("/sq/")).records == []
    survivor = await writer.put("/sq/", b"late", sequential=True)
    parked.release()
    assert await deleting == 3

    later = await writer.put("/sq/", b"later", sequential=True)
    fresh = await make_store().put("/sq/", b"fresh", sequential=True)  # no cached counter
    keys = [r.key for r in (await writer.list_prefix("/sq/")).records]
    assert keys == [survivor.key, later.key, fresh.key], keys
    assert survivor.key < later.key < fresh.key


async def test_delete_range_of_an_idle_prefix_still_forgets_its_counter(
    make_store: MakeStore,
) -> None:
    """The documented reset holds for a prefix left empty, and for every client: another
    client's cached counter does not bring the old numbering back."""
    writer, deleter = make_store(), make_store()
    await writer.put("/idle/", b"1", sequential=True)
    await writer.put("/idle/", b"2", sequential=True)
    assert await deleter.delete_range("/idle/") == 2
    again = await writer.put("/idle/", b"3", sequential=True)
    assert again.key == K.sequential_key("/idle/", 1)
    counters = await deleter.engine.range(
        K.sequence_counter_key(b"/idle/"), K.sequence_counter_key(b"/idle0")
    )
    assert [kv.value for kv in counters.kvs] == [b"1"]
