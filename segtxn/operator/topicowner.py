"""Which ScalableTopic a topic belongs to: the safety check before the operator changes or
deletes a topic's data.

A ScalableTopic names a topic; the topic may exist already, made by clients (brokers with
``autoCreateTopics``), by hand through the admin API, or by another ScalableTopic naming the
same tenant, namespace and topic. Deleting such a resource must not delete that topic, and
resharding it must not reshape another owner's topology. So a resource changes and deletes
only a topic it created, and the record of that is on the topic itself: when the operator
creates a topic it sets its properties :data:`OWNER_UID` (the resource's UID) and
:data:`OWNER` (``namespace/name``, for people). The topic, not the resource's status,
because a status is lost with its resource (a re-creation, a backup restored without it)
and can be written by anyone allowed to patch it; the property lives and dies with the
data it guards. Anyone with the brokers' admin API could change it, but they could delete
the topic as well.

**A UID, not a name.** A resource deleted and created again under the same name is another
resource (Kubernetes' owner references compare UIDs for the same reason): it does not
inherit a topic its predecessor created and left behind (``deleteData: false``, or a
deletion that found no brokers). It is refused like any other foreign topic; handing the
topic over is deliberate: set the topic's :data:`OWNER_UID` property to the new resource's
UID (docs/kubernetes.md, "Topics the operator did not create").

**A create whose answer was lost.** Creating the topic and setting its properties are two
calls (the brokers' create takes no properties). Before the create, the resource's status
says ``creating: <its UID>`` (:func:`ensure`'s ``intend``); the property written, the
handler clears it. An operator that crashes between the two calls, or a create that timed
out after the brokers made the topic, leaves a topic without an owner and the resource's
status saying it asked: the next attempt takes that topic as its own. The intent is
withdrawn when the brokers answered that they made nothing (any error answer), so a topic a
client creates after a refused create is not taken. What is left: a create timed out
without the brokers making the topic, and a client created it before the retry; the
resource then takes it. The window is one retry delay, and needs both a lost answer and a
client creating that very name.

**A deletion checks ownership in the brokers' own step.** Reading the owner and then
deleting would be two calls, and a topic deleted and created again by someone else between
them (without the property, or with another owner's) would be deleted. So :func:`delete`
reads the owner to decide, and then asks the brokers to delete the topic only if its
:data:`OWNER_UID` is still what it read (or still unset, when this resource's ``creating``
is what made it its own): the brokers check that precondition in the store step that
commits to the deletion (segtxn/broker/deletion.py), and refuse with ``PreconditionFailed``
when it does not hold; the topic is then read and judged again. What remains is the
create's window above, and brokers older than this precondition, which ignore it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from segtxn.client.admin import Admin
from segtxn.client.errors import ErrorCategory, Timeout
from segtxn.protocol.errors import (
    PreconditionFailed,
    ServerError,
    TopicAlreadyExists,
    TopicNotFound,
)
from segtxn.protocol.preconditions import PropertyPrecondition

OWNER_UID = "segtxn.io/owner-uid"
"""Topic property: the UID of the ScalableTopic that created the topic."""
OWNER = "segtxn.io/owner"
"""Topic property: ``namespace/name`` of that ScalableTopic (for people and messages)."""
DELETE_ATTEMPTS = 3
"""How many times :func:`delete` reads the topic again after the brokers refused its
precondition (the topic changed between the read and the delete), before it gives up."""


@dataclass(frozen=True)
class Owner:
    """A ScalableTopic, as a topic's properties record it."""

    uid: str
    name: str
    """``namespace/name``."""

    def properties(self) -> dict[str, str]:
        return {OWNER_UID: self.uid, OWNER: self.name}


class ForeignTopic(Exception):
    """The topic exists and was not created by this resource: it is left alone."""

    reason = "TopicOwnedElsewhere"

    def __init__(self, topic: str, found: Mapping[str, str]) -> None:
        holder = found.get(OWNER_UID)
        if holder is None:
            whose = "was not created by the operator (clients or the admin API made it)"
        else:
            whose = f"belongs to ScalableTopic {found.get(OWNER, '?')} (uid {holder})"
        super().__init__(
            f"{topic} exists and {whose}: this ScalableTopic neither changes nor deletes "
            f"it. Name another topic, or hand it over by setting its property {OWNER_UID} "
            "to this resource's uid (docs/kubernetes.md, \"Topics the operator did not "
            'create")'
        )
        self.holder = holder


def owns(found: Mapping[str, str], owner: Owner, *, creating: bool) -> bool:
    """Whether a topic with properties ``found`` is ``owner``'s: its UID is recorded, or no
    owner is recorded and ``owner`` asked to create it (``creating``: its status says so)."""
    holder = found.get(OWNER_UID)
    return holder == owner.uid or (holder is None and creating)


async def ensure(
    admin: Admin,
    topic: str,
    owner: Owner,
    *,
    segments: int,
    creating: bool,
    intend: Callable[[bool], Awaitable[None]],
) -> bool:
    """Make sure ``topic`` exists and is ``owner``'s; True when this call created it (or
    finished creating it: its owner recorded).

    Args:
        creating: the resource's status says it asked for this topic's creation before.
        intend: records (True) or withdraws (False) that intent in the resource's status;
            it must have been recorded before the create request is sent.

    Raises:
        ForeignTopic: the topic exists and is not ``owner``'s.
        ServerError, Timeout: the brokers refused or did not answer (the topic may then
            exist without its owner recorded, and ``creating`` says so next time).
    """
    try:
        found = await admin.properties(topic)
    except TopicNotFound:
        await intend(True)
        try:
            await admin.create_topic(topic, segments=segments)
        except TopicAlreadyExists:  # someone else made it since it was looked up
            await intend(False)
            raise ForeignTopic(topic, {}) from None
        except Timeout as e:
            if e.category is ErrorCategory.RETRIABLE:  # nothing was sent
                await intend(False)
            raise
        except ServerError:  # an answer: nothing was created
            await intend(False)
            raise
        await admin.update_properties(topic, owner.properties())
        return True
    if found.get(OWNER_UID) == owner.uid:
        return False
    if owns(found, owner, creating=creating):
        await admin.update_properties(topic, owner.properties())
        return True
    raise ForeignTopic(topic, found)


async def delete(admin: Admin, topic: str, owner: Owner, *, creating: bool) -> bool:
    """Delete ``topic`` and its data (``force``: its clients are disconnected) if it is
    ``owner``'s (:func:`owns`); True when it was deleted, False when it is another's and was
    left as it is.

    The owner read is only the decision: the delete carries the precondition "its
    :data:`OWNER_UID` is what was read" (the UID, or unset when ``creating`` made it
    ``owner``'s), which the brokers check in the step that commits to the deletion. A topic
    that changed in between (deleted and created again by someone else, handed over) is
    refused by them and judged again, as it is then.

    Args:
        creating: the resource's status says it asked for this topic's creation before.

    Raises:
        TopicNotFound: there is no such topic (any more).
        PreconditionFailed: the topic changed between each of :data:`DELETE_ATTEMPTS` reads
            and the delete that followed it (nothing was deleted; try again later).
        ServerError, Timeout: the brokers refused or did not answer.
    """
    attempt = 1
    while True:
        found = await admin.properties(topic)
        if not owns(found, owner, creating=creating):
            return False
        read = PropertyPrecondition(OWNER_UID, found.get(OWNER_UID))  # the uid, or unset
        try:
            await admin.delete_topic(topic, force=True, precondition=read)
        except PreconditionFailed:  # changed since it was read: judge it again
            if attempt == DELETE_ATTEMPTS:
                raise
            attempt += 1
            continue
        return True
