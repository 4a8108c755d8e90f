"""Topic names: the three domains and how they parse.

- ``persistent://tenant/namespace/topic``: a plain topic (v4 transactions);
- ``topic://tenant/namespace/name``: a scalable topic, a DAG of range segments;
- ``segment://tenant/namespace/name/<id>``: one range segment of a scalable topic.

Each part is 1-128 characters of letters, digits and ``-_.=``; segment ids are decimal.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=-]{0,127}$")


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

    @classmethod
    def parse(cls, text: str) -> TopicName:
        """Parse ``domain://tenant/namespace/name[/segment]``.

        Raises:
            InvalidTopicName: with a message that says which part is wrong.
        """
        if not isinstance(text, str):
            raise InvalidTopicName(f"a topic name is a string, not {type(text).__name__}")
        scheme, sep, rest = text.partition("://")
        if not sep:
            raise InvalidTopicName(f"{text!r}: expected domain://tenant/namespace/name")
        try:
            domain = Domain(scheme)
        except ValueError:
            known = ", ".join(f"{d.value}://" for d in Domain)
            raise InvalidTopicName(
                f"{text!r}: unknown domain {scheme!r} (one of {known})"
            ) from None
        parts = rest.split("/")
        expected = 4 if domain is Domain.SEGMENT else 3
        if len(parts) != expected:
            shape = "tenant/namespace/name" + ("/<segment id>" if domain is Domain.SEGMENT else "")
            raise InvalidTopicName(f"{text!r}: expected {domain.value}://{shape}")
        for part in parts[:3]:
            if not _PART.match(part):
                raise InvalidTopicName(
                    f"{text!r}: {part!r} must be 1-128 of letters, digits and -_.= "
                    "(starting with a letter or digit)"
                )
        segment = None
        if domain is Domain.SEGMENT:
            if not parts[3].isdigit() or len(parts[3]) > 18:
                raise InvalidTopicName(f"{text!r}: segment id {parts[3]!r} must be a number")
            segment = int(parts[3])
        return cls(domain, parts[0], parts[1], parts[2], segment)

    def __str__(self) -> str:
        base = f"{self.domain.value}://{self.tenant}/{self.namespace}/{self.local}"
        return base if self.segment is None else f"{base}/{self.segment}"

    @property
    def path(self) -> str:
        """The name as a URL path: ``domain/tenant/namespace/name[/segment]``."""
        return str(self).replace("://", "/", 1)

    @classmethod
    def from_path(cls, path: str) -> TopicName:
        domain, _, rest = path.strip("/").partition("/")
        return cls.parse(f"{domain}://{rest}")

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
