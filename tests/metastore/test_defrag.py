"""Defragmenting etcd (segtxn/metastore/defrag.py) on a real etcd: fill it, delete, compact,
and a round gives the free pages back to the disk; a member below the threshold, or a round
that cannot see every member, is left alone."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from segtxn.cli.commands import main
from segtxn.metastore import StoreUnavailable, defrag, open_store
from segtxn.metastore.defrag import (
    MIB,
    DefragSettings,
    MemberStatus,
    defragment_round,
    due,
    run_defragmentation,
)
from segtxn.metastore.etcd_server import EtcdServer, free_port
from tests.waiting import wait_until

VALUE = b"x" * (16 << 10)
LOOK = DefragSettings(min_free_bytes=1 << 40)
"""A round that only looks: no member has a TiB free."""


@pytest.fixture
def etcd() -> Iterator[EtcdServer]:
    """A private etcd that compacts nothing by itself (the test compacts)."""
    server = EtcdServer.in_temp_dir(unsafe_no_fsync=True, auto_compaction=None)
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def _fill_delete_compact(server: EtcdServer, count: int = 1500) -> None:
    """``count`` values of 16 KiB written, then deleted and the history compacted: the
    database file keeps its size, with most of it free pages."""
    async with open_store(server.url("/fill")) as store:
        for start in range(0, count, 50):
            await asyncio.gather(
                *(store.put(f"/v/{i:05d}", VALUE) for i in range(start, start + 50))
            )
        await store.delete_range("/v/")
        await store.engine.compact(await store.engine.current_revision())

        async def freed() -> bool:
            # the pages compaction freed are reused (and counted free) only from a later
            # write on: a live cluster always has one
            await store.put("/tick", b"")
            (member,) = (await defragment_round([server.endpoint], LOOK)).members
            return member.free_bytes >= count * len(VALUE) // 2

        await wait_until(freed, what="the compacted revisions' pages freed")


async def test_a_round_gives_the_free_pages_back(
    etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    await _fill_delete_compact(etcd)
    settings = DefragSettings(min_free_bytes=8 * MIB)
    untouched = await defragment_round([etcd.endpoint], LOOK)
    (member,) = untouched.members
    assert untouched.defragmented == [] and not untouched.skipped
    assert member.free_bytes >= 16 * MIB, member  # the deletes freed most of the file
    assert member.leader  # a single member leads

    with caplog.at_level(logging.INFO, logger="segtxn.metastore.defrag"):
        done = await defragment_round([etcd.endpoint], settings)
    (defragmented,) = done.defragmented
    assert defragmented.before.db_size >= member.db_size - MIB
    assert defragmented.after.db_size < defragmented.before.db_size - 16 * MIB
    assert defragmented.after.free_bytes < settings.min_free_bytes
    assert "defragmented in" in caplog.text and "MiB in use" in caplog.text

    again = await defragment_round([etcd.endpoint], settings)
    assert again.defragmented == []  # nothing left to give back
    async with open_store(etcd.url("/fill")) as store:  # and the store works on
        await store.put("/after", b"1")
        record = await store.get("/after")
        assert record is not None and record.value == b"1"


async def test_a_member_that_does_not_answer_skips_the_round(
    etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The member list names a member whose client URL answers nothing (forced: the URL
    is replaced by a dead port): nothing is defragmented, since blocking one member while
    another is down could cost the cluster its quorum."""
    await _fill_delete_compact(etcd, count=600)
    dead = f"127.0.0.1:{free_port()}"
    settings = DefragSettings(min_free_bytes=MIB, request_timeout_s=1.0)
    monkeypatch.setattr(defrag, "_client_endpoint", lambda member: dead)
    skipped = await defragment_round([etcd.endpoint], settings)
    assert skipped.defragmented == [] and dead in skipped.skipped
    monkeypatch.undo()
    (member,) = (await defragment_round([etcd.endpoint], LOOK)).members
    assert member.free_bytes >= MIB  # still there to give back


async def test_the_member_list_comes_from_the_first_endpoint_that_answers(
    etcd: EtcdServer,
) -> None:
    await _fill_delete_compact(etcd, count=600)
    dead = f"127.0.0.1:{free_port()}"
    settings = DefragSettings(min_free_bytes=MIB, request_timeout_s=1.0)
    with pytest.raises(StoreUnavailable, match="no etcd endpoint listed its members"):
        await defragment_round([dead], settings)
    result = await defragment_round([dead, etcd.endpoint], settings)
    assert len(result.defragmented) == 1


def test_followers_go_first_and_the_leader_last() -> None:
    def member(name: str, free_mib: int, *, leader: bool = False) -> MemberStatus:
        return MemberStatus(name, f"{name}:2379", 1, 100 * MIB, (100 - free_mib) * MIB, leader)

    members = [member("etcd-0", 90, leader=True), member("etcd-1", 10), member("etcd-2", 60)]
    assert [m.name for m in due(members, 50 * MIB)] == ["etcd-2", "etcd-0"]
    assert [m.name for m in due(members, 5 * MIB)] == ["etcd-1", "etcd-2", "etcd-0"]
    assert due(members, 95 * MIB) == []


async def test_the_loop_runs_rounds_until_cancelled(etcd: EtcdServer) -> None:
    await _fill_delete_compact(etcd, count=600)

    (before,) = (await defragment_round([etcd.endpoint], LOOK)).members
    loop = asyncio.create_task(
        run_defragmentation([etcd.endpoint], DefragSettings(min_free_bytes=MIB, check_s=0.05))
    )

    async def shrunk() -> bool:
        (now,) = (await defragment_round([etcd.endpoint], LOOK)).members
        return now.db_size < before.db_size - MIB

    try:
        await wait_until(shrunk, timeout=20, what="a round of the loop defragmented etcd")
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert loop.cancelled()


def test_the_command_defragments_and_prints_what_it_did(etcd: EtcdServer) -> None:
    asyncio.run(_fill_delete_compact(etcd, count=600))
    url = f"etcd://{etcd.endpoint}"
    result = CliRunner().invoke(main, ["store", "defrag", "--store", url, "--min-free-mib", "1"])
    assert result.exit_code == 0, result.output
    assert "leader" in result.output and " in " in result.output  # "<after> in <s> s"
    again = CliRunner().invoke(
        main, ["store", "defrag", "--store", url, "--min-free-mib", "1", "-o", "json"]
    )
    assert again.exit_code == 0, again.output
    data = json.loads(again.output)
    assert data["defragmented"] == [] and data["skipped"] == ""
    assert data["members"][0]["db_size"] < 8 * MIB
    refused = CliRunner().invoke(main, ["store", "defrag", "--store", "memory://"])
    assert refused.exit_code == 2 and "etcd://" in refused.output
