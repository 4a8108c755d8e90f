"""``segtxn topics``: create, list, inspect, split, merge and delete topics; their
subscriptions' commands (list, reset, delete, repair a cursor record that does not read)
are in :mod:`segtxn.cli.subscriptions`, added to the group here.

The commands that print data take ``-o table|json`` (:mod:`segtxn.cli.output`). ``split``
and ``merge`` print one line saying what changed and which segments are active; the whole
DAG the broker answered with is their ``-o json``. ``autoscale`` is the operator's
automatic split/merge once, without Kubernetes: measure, decide, and (``--apply``) act.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import click

from segtxn.cli.errors import answer_lost, describe, in_words
from segtxn.cli.output import OUTPUT, Table, hash_range, show, since
from segtxn.cli.params import COUNT, FloatRange, KeyHash, Namespace, Topic, refuse_unless
from segtxn.cli.service import URL, run
from segtxn.cli.subscriptions import COMMANDS as SUBSCRIPTION_COMMANDS
from segtxn.client import Client, ClientError, ServerError, Timeout
from segtxn.protocol.errors import ConsumerBusy
from segtxn.protocol.names import Domain
from segtxn.topics.autoscale import (
    KNOBS,
    TOP_KNOBS,
    Action,
    PolicyError,
    changes_of,
    decide,
    policy_from,
    segments_of,
    track_cold,
    unknown_knobs,
)
from segtxn.topics.model import MAX_INITIAL_SEGMENTS
from segtxn.topics.segmentload import Load, MalformedStats, rates, reading

SCALABLE = Topic(Domain.TOPIC)
LISTED = (Domain.PERSISTENT, Domain.TOPIC)
"""The domains ``topics list`` lists by default (segments are listed with their topic's
stats, not here)."""


@click.group()
def topics() -> None:
    """Create, list, inspect and delete topics."""


for _command in SUBSCRIPTION_COMMANDS:
    topics.add_command(_command)


@topics.command("create")
@URL
@click.argument("topic", type=Topic(Domain.TOPIC, Domain.PERSISTENT))
@click.option(
    "--segments",
    default=1,
    show_default=True,
    type=click.IntRange(1, MAX_INITIAL_SEGMENTS),
    help="Range segments (topic:// only).",
)
@click.pass_context
def create(ctx: click.Context, url: str, topic: str, segments: int) -> None:
    """Create TOPIC (persistent://t/ns/name or topic://t/ns/name)."""
    scalable = topic.startswith(f"{Domain.TOPIC.value}://")
    refuse_unless(ctx, "segments", scalable, "only a topic:// topic has segments")
    count = segments if scalable else None  # a persistent topic has none: the broker refuses one
    run(lambda c: c.admin.create_topic(topic, segments=count), url)
    click.echo(f"created {topic}")


@topics.command("list")
@URL
@click.argument("namespace", type=Namespace())
@click.option(
    "--domain",
    default=None,
    type=click.Choice([d.value for d in LISTED]),
    help="Only this kind of topic (default: both).",
)
@OUTPUT
def list_(url: str, namespace: tuple[str, str], domain: str | None, output: str) -> None:
    """List the topics of NAMESPACE (tenant/namespace): persistent:// and topic://."""
    tenant, ns = namespace
    domains = [domain] if domain else [d.value for d in LISTED]

    async def body(client: Client) -> list[str]:
        found = []
        for each in domains:
            found += await client.admin.list_topics(each, tenant, ns)
        return sorted(found)

    found = run(body, url)
    rows = [[name] for name in found]
    show(output, found, Table(("topic",), rows, empty=f"no topics in {tenant}/{ns}"))


def scalable_stats(data: dict[str, Any]) -> str:
    """A ``topic://`` topic's statistics for people: its layout and last change in a line,
    then a row per segment (the sealed ones too: their backlog is still read)."""
    head = f"{data['topic']}: epoch {data['epoch']}, active segments: {data['activeSegments']}"
    change = data.get("lastChange")
    if change:
        parents = ", ".join(map(str, change["parents"]))
        children = ", ".join(map(str, change["children"]))
        head += f"; last change: {change['kind']} of {parents} into {children}, "
        head += since(int(change["finishedMs"]))
    empty: dict[str, Any] = {
        "msgInCounter": None,
        "bytesInCounter": None,
        "producers": None,
        "subscriptions": {},
    }
    rows = []
    for s in data["segments"]:
        stats = s["stats"] or empty  # none for a RETIRED segment: its data is gone
        rows.append(
            (
                s["id"],
                s["state"],
                hash_range(s["range"]),
                stats["msgInCounter"],
                stats["bytesInCounter"],
                stats["producers"],
                sum(sub["backlog"] or 0 for sub in stats["subscriptions"].values())
                if s["stats"]
                else None,
                ", ".join(sorted(stats["subscriptions"])) or None,
            )
        )
    columns = ("segment", "state", "range", "msgs in", "bytes in", "producers", "backlog")
    table = Table((*columns, "subscriptions"), rows)
    unreachable = [
        f"segment {s['id']}: unreachable: {s['unreachable']}"
        for s in data["segments"]
        if s.get("unreachable")
    ]
    return "\n".join([head, table.render(), *unreachable])


@topics.command("stats")
@URL
@click.argument("topic", type=Topic())
@OUTPUT
def stats(url: str, topic: str, output: str) -> None:
    """Print TOPIC's statistics (a topic:// topic's: a row per segment).

    A topic:// topic with a segment whose broker cannot be reached: the other segments are
    shown, that one is marked unreachable with why (-o json: its "unreachable"), and the
    exit status is 0; it is 1 only when no segment could be reached."""

    async def body(client: Client) -> dict[str, Any]:
        try:
            return await client.admin.stats(topic)
        except (ServerError, Timeout) as e:
            if not topic.startswith(f"{Domain.TOPIC.value}://") or not e.retriable:
                raise
            found = await client.admin.segment_stats(topic)
            if not any(s["stats"] for s in found["segments"]):
                raise  # none reached: the topic's own error says why
            for segment in found["segments"]:
                if "unreachable" in segment:
                    segment["unreachable"] = in_words(segment["unreachable"])
            return found

    found = run(body, url)
    show(output, found, scalable_stats(found) if "segments" in found else None)


@topics.command("delete")
@URL
@click.argument("topic", type=Topic(Domain.TOPIC, Domain.PERSISTENT))
@click.option("--force", is_flag=True, help="Even with connected clients.")
def delete(url: str, topic: str, force: bool) -> None:
    """Delete TOPIC and its data."""
    try:
        run(lambda c: c.admin.delete_topic(topic, force=force), url)
    except ConsumerBusy as e:
        raise click.ClickException(
            f"{topic} has connected clients; --force deletes it anyway, disconnecting them"
        ) from e
    click.echo(f"deleted {topic}")


@topics.command("properties")
@URL
@click.argument("topic", type=Topic(Domain.TOPIC, Domain.PERSISTENT))
@click.option("--set", "assignments", multiple=True, help="KEY=VALUE (repeatable).")
@click.option("--remove", "removals", multiple=True, help="KEY (repeatable).")
@OUTPUT
def properties(
    url: str, topic: str, assignments: tuple[str, ...], removals: tuple[str, ...], output: str
) -> None:
    """Show TOPIC's properties, after setting or removing some (a key may not be both)."""
    updates = {}
    for assignment in assignments:
        key, sep, value = assignment.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(
                f"{assignment!r}: expected KEY=VALUE with a KEY", param_hint="'--set'"
            )
        updates[key] = value
    for key in removals:
        if not key.strip():
            raise click.BadParameter("an empty KEY", param_hint="'--remove'")
        if key in updates:  # neither order of the two would be what both asked
            raise click.BadParameter(
                f"{key!r} is both set (--set) and removed (--remove): which should win? "
                "give it to one",
                param_hint="'--remove'",
            )

    async def body(client: Client) -> dict[str, str]:
        if updates:
            await client.admin.update_properties(topic, updates)
        for key in removals:
            await client.admin.remove_property(topic, key)
        return await client.admin.properties(topic)

    found = run(body, url)
    show(output, found, Table(("key", "value"), sorted(found.items()), empty="no properties"))


def _segments(dag: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {int(s["id"]): s for s in dag["segments"]}


def _named(segment: dict[str, Any]) -> str:
    return f"{segment['id']} [{hash_range(segment['range'])}]"


def _active(dag: dict[str, Any]) -> str:
    ids = sorted(int(s["id"]) for s in dag["segments"] if s["state"] == "ACTIVE")
    return f"active segments: {', '.join(map(str, ids))} (epoch {dag['epoch']})"


def split_summary(topic: str, segment: int, dag: dict[str, Any]) -> str:
    """``split segment 0 [0x0000-0xffff] of T into 1 [...] and 2 [...]; active segments:
    1, 2 (epoch 1)``: what a split did, from the DAG it answered with."""
    by_id = _segments(dag)
    parent = by_id[segment]
    children = " and ".join(_named(by_id[c]) for c in parent["children"])
    return f"split segment {_named(parent)} of {topic} into {children}; {_active(dag)}"


def merge_summary(topic: str, first: int, second: int, dag: dict[str, Any]) -> str:
    """``merged segments 1 [...] and 2 [...] of T into 3 [...]; active segments: ...``."""
    by_id = _segments(dag)
    into = " and ".join(_named(by_id[c]) for c in by_id[first]["children"])
    parents = f"{_named(by_id[first])} and {_named(by_id[second])}"
    return f"merged segments {parents} of {topic} into {into}; {_active(dag)}"


@topics.command("split")
@URL
@click.argument("topic", type=SCALABLE)
@click.argument("segment", type=COUNT)
@click.option(
    "--at",
    default=None,
    type=KeyHash(),
    help="Split at this key hash, 0x0001-0xffff inside the segment's range, in hex (0x...) "
    "or decimal (default: the middle of its range).",
)
@OUTPUT
def split(url: str, topic: str, segment: int, at: int | None, output: str) -> None:
    """Split SEGMENT of scalable TOPIC in two; says into which (-o json: the new DAG).

    If the broker's answer is lost (the connection broke, or no answer in time), the split
    may or may not have happened: it says so, and `segtxn topics stats TOPIC` shows the
    segments and the last change (exit status 1)."""
    dag = _changing(
        f"the split of segment {segment} of {topic}",
        topic,
        url,
        lambda c: c.admin.split(topic, segment, at=at),
    )
    show(output, dag, split_summary(topic, segment, dag))


def _changing(
    change: str, topic: str, url: str, call: Callable[[Client], Awaitable[dict[str, Any]]]
) -> dict[str, Any]:
    """Run a split or merge; if its answer was lost, fail saying that ``change`` may or
    may not have happened, and how to look."""
    try:
        return run(call, url)
    except (ClientError, ServerError) as e:
        if not answer_lost(e):
            raise
        raise click.ClickException(
            f"the answer was lost ({describe(e)}): {change} may or may not have happened; "
            f"'segtxn topics stats {topic}' shows its segments and last change"
        ) from e


@topics.command("merge")
@URL
@click.argument("topic", type=SCALABLE)
@click.argument("first", type=COUNT)
@click.argument("second", type=COUNT)
@OUTPUT
def merge(url: str, topic: str, first: int, second: int, output: str) -> None:
    """Merge two adjacent active segments of scalable TOPIC; says into which (-o json: the
    new DAG). A lost answer is said as for split."""
    if first == second:
        raise click.BadParameter("a segment cannot be merged with itself", param_hint="SECOND")
    dag = _changing(
        f"the merge of segments {first} and {second} of {topic}",
        topic,
        url,
        lambda c: c.admin.merge(topic, first, second),
    )
    show(output, dag, merge_summary(topic, first, second, dag))


def _policy(text: str) -> dict[str, Any]:
    try:
        found = json.loads(text)
    except ValueError as e:
        raise click.BadParameter(f"not JSON: {e}", param_hint="--policy") from e
    if not isinstance(found, dict):
        raise click.BadParameter("a JSON object, as spec.autoscale", param_hint="--policy")
    unknown = unknown_knobs(found)
    if unknown:  # else a misspelt knob would keep its default, unsaid
        known = ", ".join(
            [*(k for k in TOP_KNOBS if k not in KNOBS)]
            + [f"{section}.{knob}" for section, knobs in KNOBS.items() for knob in knobs]
        )
        raise click.BadParameter(
            f"unknown knob{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} (known: {known})",
            param_hint="--policy",
        )
    try:
        policy_from(found)
    except PolicyError as e:
        raise click.BadParameter(str(e), param_hint="--policy") from e
    return found


@topics.command("autoscale")
@URL
@click.argument("topic", type=SCALABLE)
@click.option("--window", default=10.0, show_default=True,
              type=FloatRange(min=0.1, max=3600),
              help="Seconds between the two readings the rates are measured over.")  # fmt: skip
@click.option("--policy", "policy_text", default="{}", metavar="JSON",
              help="The knobs, as a ScalableTopic's spec.autoscale (split, merge, maxSegments, "
              "minSegments, maxDagDepth); absent ones take PIP-483's defaults, unknown ones "
              "are refused.")  # fmt: skip
@click.option("--apply", "apply_", is_flag=True, help="Make the change decided (else only say it).")
@OUTPUT
def autoscale(
    *, url: str, topic: str, window: float, policy_text: str, apply_: bool, output: str
) -> None:
    """Measure each active segment of scalable TOPIC over --window seconds and say what
    automatic split/merge would do now (split X, merge X and Y, or nothing, and why).

    Two adjacent segments count as cold for the window only: to see a merge, give a
    merge.windowSeconds no longer than --window."""
    policy = policy_from(_policy(policy_text))

    async def body(client: Client) -> dict[str, Any]:
        first = await client.admin.stats(topic)
        started = time.time()
        before = reading(first, time.monotonic())
        await asyncio.sleep(window)  # the measuring window itself
        second = await client.admin.stats(topic)
        loads = rates(before, reading(second, time.monotonic()))
        cold = track_cold(None, loads, policy, started)  # cold over the window: since its start
        history = dataclasses.replace(changes_of(second), cold_since_s=cold)
        decision = decide(segments_of(second), loads, policy, history, time.time())
        dag = None
        if apply_ and decision.action is Action.SPLIT:
            dag = await client.admin.split(topic, decision.segments[0])
        elif apply_ and decision.action is Action.MERGE:
            dag = await client.admin.merge(topic, *decision.segments)
        return {
            "action": decision.action.value,
            "segments": list(decision.segments),
            "reason": decision.why.value,
            "message": decision.message,
            "loads": {str(k): dataclasses.asdict(v) for k, v in sorted(loads.items())},
            "dag": dag,
        }

    try:
        found = run(body, url)
    except MalformedStats as e:
        raise click.ClickException(f"{topic}: {e}") from e
    lines = [f"segment {k}: {Load(**v).describe()}" for k, v in found["loads"].items()]
    action = "no change" if found["action"] == Action.NONE.value else found["action"]
    said = f"{action} ({found['reason']}): {found['message']}"
    if found["dag"] is not None:
        first, *rest = found["segments"]
        dag = found["dag"]
        said = (split_summary(topic, first, dag) if not rest
                else merge_summary(topic, first, rest[0], dag))  # fmt: skip
    elif found["action"] != Action.NONE.value:
        said += " (not made: --apply makes it)"
    show(output, found, "\n".join([*lines, said]))
