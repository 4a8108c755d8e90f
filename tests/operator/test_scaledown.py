"""The scale-down guard's decision, on answers given to it (no brokers needed)."""

from __future__ import annotations

from typing import Any

from segtxn.client.admin import Admin, BrokerHomes
from segtxn.client.errors import Timeout
from segtxn.ledger.replicas import Replication
from segtxn.operator import scaledown
from segtxn.protocol.errors import ErrorName, ServerError


class Answers(Admin):
    """An Admin whose broker_homes answers from a table (or fails); records who was asked.
    Its drain_broker empties a broker's homes, except those of the ``stuck`` brokers (as a
    ledger from before replication); records who was drained."""

    def __init__(
        self,
        homes: dict[str, list[str]],
        fail: Exception | None = None,
        stuck: frozenset[str] = frozenset(),
    ) -> None:
        self.homes, self.fail, self.asked = homes, fail, list[tuple[str, int]]()
        self.stuck, self.drained = stuck, list[str]()

    async def drain_broker(self, broker: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        self.drained.append(broker)
        if broker in self.stuck:
            failed = {home: "written before replication" for home in self.homes.get(broker, [])}
            return {"broker": broker, "moved": [], "failed": failed}
        moved = self.homes.pop(broker, [])
        return {"broker": broker, "moved": moved, "failed": {}}

    async def broker_homes(self, broker: str, *, limit: int = 100) -> BrokerHomes:
        self.asked.append((broker, limit))
        if self.fail is not None:
            raise self.fail
        held = self.homes.get(broker, [])
        return BrokerHomes(broker, held[:limit], len(held) > limit)


def test_the_highest_ordinals_go() -> None:
    assert scaledown.going("c-broker", 5, 3) == ["c-broker-3", "c-broker-4"]
    assert scaledown.going("c-broker", 3, 3) == []


async def test_empty_brokers_may_go() -> None:
    answers = Answers({"c-broker-0": ["persistent://t/n/a"]})
    verdict = await scaledown.check(answers, "c-broker", 3, 1)
    assert verdict.allowed
    assert [b for b, _ in answers.asked] == ["c-broker-1", "c-broker-2"]  # not the one kept


async def test_a_broker_holding_anything_blocks_and_is_named() -> None:
    many = [f"segment://t/n/s/{i}" for i in range(9)]
    answers = Answers({"c-broker-2": ["persistent://t/n/p"], "c-broker-3": many})
    verdict = await scaledown.check(answers, "c-broker", 4, 2)
    assert not verdict.allowed
    assert "spec.brokers.replicas 4 -> 2 refused" in verdict.message
    assert "c-broker-2 holds persistent://t/n/p;" in verdict.message
    named = ", ".join(many[: scaledown.NAMED])
    assert f"c-broker-3 holds {named} and more." in verdict.message  # bounded, says so
    assert "keep 4 brokers" in verdict.message
    assert all(limit == scaledown.NAMED + 1 for _, limit in answers.asked)


async def test_not_knowing_is_a_refusal() -> None:
    for failure in (ServerError(ErrorName.SERVICE_NOT_READY, "down"), Timeout("no answer")):
        verdict = await scaledown.check(Answers({}, fail=failure), "c-broker", 2, 1)
        assert not verdict.allowed
        assert "cannot tell whether c-broker-1 hold data" in verdict.message


async def test_with_replication_the_brokers_that_go_are_drained_first() -> None:
    """Before the drain these would refuse (they hold topics); drained, they hold none."""
    answers = Answers({"c-broker-3": ["topic://t/n/a"], "c-broker-4": ["topic://t/n/b"]})
    verdict = await scaledown.check(answers, "c-broker", 5, 3, replication=Replication(3, 2))
    assert verdict.allowed, verdict.message
    assert answers.drained == ["c-broker-3", "c-broker-4"]  # the ones that go, only
    assert [b for b, _ in answers.asked] == ["c-broker-3", "c-broker-4"]  # then checked
    assert verdict.lost is not None
    assert "c-broker-3, c-broker-4 go with their replicas of other brokers' ledgers" in (
        verdict.lost
    )
    assert "background repair copies it to another broker" in verdict.lost


async def test_what_a_drain_cannot_move_refuses_and_says_why() -> None:
    answers = Answers({"c-broker-2": ["topic://t/n/old"]}, stuck=frozenset({"c-broker-2"}))
    verdict = await scaledown.check(answers, "c-broker", 3, 2, replication=Replication(2, 1))
    assert not verdict.allowed and not verdict.final
    assert "c-broker-2 holds topic://t/n/old" in verdict.message
    assert "draining c-broker-2 failed: topic://t/n/old: written before replication" in (
        verdict.message
    )
    assert verdict.lost is None


async def test_without_replication_nothing_is_drained() -> None:
    answers = Answers({"c-broker-2": ["topic://t/n/a"]})
    verdict = await scaledown.check(answers, "c-broker", 3, 2)
    assert not verdict.allowed and answers.drained == []
