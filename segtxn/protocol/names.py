"""Topic names: the three domains and how they parse.

- ``persistent://tenant/namespace/topic``: a plain topic (v4 transactions);
- ``topic://tenant/namespace/name``: a scalable topic, a DAG of range segments;
- ``segment://tenant/namespace/name/<id>``: one range segment of a scalable topic.

Parts are letters, digits and ``-_.=``, starting with a letter or digit; segment ids are
decimal. Their lengths are bounded so that every file name and store key derived from a name
fits (:mod:`segtxn.protocol.limits`): tenant and namespace 1-64, name 1-128, the three together
at most 140 (a ``=`` counts three: it is quoted in file names).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from segtxn.protocol.limits import (
    MAX_CLIENT_NAME,
    MAX_LOCAL_NAME,
    MAX_NAMESPACE,
    MAX_SEGMENT_ID_DIGITS,
    MAX_SUBSCRIPTION,
    MAX_TENANT,
    MAX_TOPIC_PARTS,
    storage_length,
)

_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.=-]*")  # fullmatch: "$" would take a "\n"
_SEGMENT_ID = re.compile(rf"[0-9]{{1,{MAX_SEGMENT_ID_DIGITS}}}")
_CLIENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:=-]*")


class Domain(enum.Enum):
    PERSISTENT = "persistent"
    TOPIC = "topic"
    SEGMENT = "segment"


class InvalidTopicName(ValueError):
    """A topic name that does not parse (the error name on the wire is InvalidTopicName)."""


@dataclass(frozen=True, slots=True, order=True)
class TopicName:
    domain: Domain
    tenant: str
    namespace: str
    local: str
    segment: int | None = None
    _text: str = field(init=False, repr=False, compare=False)
    """``str()`` of it, made once: a broker formats a topic's name for every transactional
    operation it records (and its metrics and logs), and the f-string with the domain's
    enum value cost more than the work around it."""

    def __post_init__(self) -> None:
        base = f"{self.domain.value}://{self.tenant}/{self.namespace}/{self.local}"
        text = base if self.segment is None else f"{base}/{self.segment}"
        object.__setattr__(self, "_text", text)  # (frozen: set once, here)

    @classmethod
    def parse(cls, text: str, *, check_lengths: bool = True) -> TopicName:
        """Parse ``domain://tenant/namespace/name[/segment]``.

        ``check_lengths=False`` is for names read back from the store: they were checked
        when their topic was created (a topic created before the length limits must still
        list, and delete).

        Raises:
            InvalidTopicName: with a message that says which part is wrong.
        """
        if not isinstance(text, str):
            raise InvalidTopicName(f"a topic name is a string, not {type(text).__name__}")
        shown = _shown(text)
        scheme, sep, rest = text.partition("://")
        if not sep:
            raise InvalidTopicName(f"{shown}: expected domain://tenant/namespace/name")
        try:
            domain = Domain(scheme)
        except ValueError:
            known = ", ".join(f"{d.value}://" for d in Domain)
            raise InvalidTopicName(
                f"{shown}: unknown domain {_shown(scheme)} (one of {known})"
            ) from None
        parts = rest.split("/")
        expected = 4 if domain is Domain.SEGMENT else 3
        if len(parts) != expected:
            shape = "tenant/namespace/name" + ("/<segment id>" if domain is Domain.SEGMENT else "")
            raise InvalidTopicName(f"{shown}: expected {domain.value}://{shape}")
        for what, part in zip(("tenant", "namespace", "name"), parts, strict=False):
            if not _PART.fullmatch(part):
                raise InvalidTopicName(
                    f"{shown}: {what} {_shown(part)} must be letters, digits and -_.= "
                    "(starting with a letter or digit)"
                )
        if check_lengths:
            _check_lengths(shown, parts[0], parts[1], parts[2])
        segment = None
        if domain is Domain.SEGMENT:
            if not _SEGMENT_ID.fullmatch(parts[3]):
                raise InvalidTopicName(
                    f"{shown}: segment id {_shown(parts[3])} must be a number "
                    f"of at most {MAX_SEGMENT_ID_DIGITS} digits"
                )
            segment = int(parts[3])
        return cls(domain, parts[0], parts[1], parts[2], segment)

    def __str__(self) -> str:
        return self._text

    @property
    def path(self) -> str:
        """The name as a URL path: ``domain/tenant/namespace/name[/segment]``."""
        return str(self).replace("://", "/", 1)

    @classmethod
    def from_path(cls, path: str, *, check_lengths: bool = True) -> TopicName:
        domain, _, rest = path.strip("/").partition("/")
        return cls.parse(f"{domain}://{rest}", check_lengths=check_lengths)

    def segment_name(self, segment_id: int) -> TopicName:
        """The ``segment://`` name of one segment of this scalable topic."""
        if self.domain is not Domain.TOPIC:
            raise InvalidTopicName(f"{self} is not a scalable topic")
        return TopicName(Domain.SEGMENT, self.tenant, self.namespace, self.local, segment_id)

    def parent(self) -> TopicName:
        """The scalable topic a segment belongs to."""
        if self.domain is not Domain.SEGMENT:
            raise InvalidTopicName(f"{self} is not a segment")
        return TopicName(Domain.TOPIC, self.tenant, self.namespace, self.local)


def _shown(text: str, limit: int = 80) -> str:
    """``repr`` of a name in an error message, cut short (messages are sent back)."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _check_lengths(shown: str, tenant: str, namespace: str, local: str) -> None:
    lengths = [storage_length(p) for p in (tenant, namespace, local)]
    for what, length, limit in zip(
        ("tenant", "namespace", "name"),
        lengths,
        (MAX_TENANT, MAX_NAMESPACE, MAX_LOCAL_NAME),
        strict=True,
    ):
        if length > limit:
            raise InvalidTopicName(
                f"{shown}: the {what} is {length} characters long; at most {limit} (a '=' counts 3)"
            )
    if sum(lengths) > MAX_TOPIC_PARTS:
        raise InvalidTopicName(
            f"{shown}: tenant, namespace and name take {sum(lengths)} characters together; "
            f"at most {MAX_TOPIC_PARTS} (a '=' counts 3), so that the files and keys named "
            "after the topic fit"
        )


def schema_pattern(limit: int) -> str:
    """A name part of at most ``limit`` characters as an anchored pattern (as the CRDs'
    OpenAPI schemas write it; they cannot weigh ``=``)."""
    return f"^{_PART.pattern.removesuffix('*')}{{0,{limit - 1}}}$"


def check_list_part(what: str, part: str) -> str:
    """A tenant or namespace given on its own (e.g. to list a namespace's topics).

    Raises:
        InvalidTopicName
    """
    limit = MAX_TENANT if what == "tenant" else MAX_NAMESPACE
    if not _PART.fullmatch(part):
        raise InvalidTopicName(
            f"{what} {_shown(part)} must be letters, digits and -_.= "
            "(starting with a letter or digit)"
        )
    if storage_length(part) > limit:
        raise InvalidTopicName(f"{what} {_shown(part)} is longer than {limit} characters")
    return part


def client_name_problem(kind: str, value: str) -> str | None:
    """What is wrong with a subscription, producer or consumer name, or None.

    Subscriptions are 1-64 characters (a v4 subscription names its pending-ack log file,
    :mod:`segtxn.protocol.limits`), producers and consumers 1-128; letters, digits and
    ``_.:=-``, starting with a letter or digit; ``:`` and ``=`` count 3.
    """
    limit = MAX_SUBSCRIPTION if kind == "subscription" else MAX_CLIENT_NAME
    if not _CLIENT_NAME.fullmatch(value) or storage_length(value) > limit:
        return (
            f"{kind} name {_shown(value)} must be 1-{limit} of letters, digits and _.:=- "
            "(starting with a letter or digit; ':' and '=' count 3)"
        )
    return None
