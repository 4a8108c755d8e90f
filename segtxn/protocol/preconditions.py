"""A precondition on a topic's property, for requests that must not act on another topic.

A caller that read a topic and decided to delete it (the operator, deleting the topic a
``ScalableTopic`` created) must not delete whatever bears the name when its request lands:
the topic may have been deleted and created again meanwhile, by someone else. So the request
names what it read, ``the property K is V`` (or ``K is not set``), and the broker checks it
in the same store step that commits to the deletion (segtxn/broker/deletion.py); when it
does not hold, nothing is changed and the answer is ``PreconditionFailed`` (412).

On the wire it is three query parameters (:data:`PARAMETERS`): ``ifProperty=K`` with
``ifPropertyValue=V`` or ``ifPropertyAbsent=true``. The client builds them with
:meth:`PropertyPrecondition.params`; the broker reads them back with
:func:`from_query`, which says exactly what is wrong with a malformed set.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from segtxn.protocol.limits import MAX_PROPERTY_KEY_BYTES, MAX_PROPERTY_VALUE_BYTES, utf8_length

IF_PROPERTY = "ifProperty"
IF_PROPERTY_VALUE = "ifPropertyValue"
IF_PROPERTY_ABSENT = "ifPropertyAbsent"
PARAMETERS = (IF_PROPERTY, IF_PROPERTY_VALUE, IF_PROPERTY_ABSENT)
"""The query parameters of a property precondition."""


@dataclass(frozen=True)
class PropertyPrecondition:
    """``the topic's property key is value``; with ``value`` None, ``it has no property
    key``. Build one with :meth:`equals` or :meth:`absent`."""

    key: str
    value: str | None

    @classmethod
    def equals(cls, key: str, value: str) -> PropertyPrecondition:
        """The property ``key`` is set to ``value`` (a non-empty string)."""
        return cls(key, value)

    @classmethod
    def absent(cls, key: str) -> PropertyPrecondition:
        """The topic has no property ``key``."""
        return cls(key, None)

    def holds(self, properties: Mapping[str, str]) -> bool:
        """Whether a topic with ``properties`` satisfies it."""
        return properties.get(self.key) == self.value

    def params(self) -> dict[str, str]:
        """The query parameters that carry it."""
        if self.value is None:
            return {IF_PROPERTY: self.key, IF_PROPERTY_ABSENT: "true"}
        return {IF_PROPERTY: self.key, IF_PROPERTY_VALUE: self.value}

    def refusal(self, topic: str, properties: Mapping[str, str]) -> str:
        """Why a topic with ``properties`` does not satisfy it (an error message)."""
        found = properties.get(self.key)
        has = "has no such property" if found is None else f"has {_cut(found)!r}"
        return f"{topic}: the precondition {self} does not hold: it {has}; nothing was deleted"

    def __str__(self) -> str:
        if self.value is None:
            return f"property {_cut(self.key)!r} is not set"
        return f"property {_cut(self.key)!r} is {_cut(self.value)!r}"


def _cut(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def from_query(get_all: Callable[[str], list[str]]) -> PropertyPrecondition | None:
    """The precondition a request's query names, None when it names none.

    Args:
        get_all: every value of a query parameter, in order (``request.query.getall(k,
            [])``): a parameter given twice is refused, not resolved by picking one.

    Raises:
        ValueError: a malformed set, with a message naming the parameter: one given twice,
            ``ifPropertyValue`` or ``ifPropertyAbsent`` without ``ifProperty`` or the reverse,
            both of them, an empty or over-long key, an empty or over-long value (an empty
            ``ifPropertyValue=`` is refused rather than taken to mean "set to nothing" or
            "not set": that is what a caller sends whose variable was empty by mistake),
            ``ifPropertyAbsent`` other than ``true``, text that is not valid UTF-8.
    """
    given: dict[str, str] = {}
    for name in PARAMETERS:
        values = get_all(name)
        if len(values) > 1:
            raise ValueError(f"{name} given {len(values)} times; a request takes one precondition")
        if values:
            given[name] = values[0]
    if not given:
        return None
    key = given.get(IF_PROPERTY)
    value = given.get(IF_PROPERTY_VALUE)
    absent = given.get(IF_PROPERTY_ABSENT)
    if key is None:
        raise ValueError(
            f"{IF_PROPERTY_VALUE} and {IF_PROPERTY_ABSENT} need {IF_PROPERTY}=KEY, the property "
            "the precondition is on"
        )
    if (value is None) == (absent is None):
        raise ValueError(
            f"{IF_PROPERTY}={_cut(key)!r} needs exactly one of {IF_PROPERTY_VALUE}=VALUE (the "
            f"value it must have) and {IF_PROPERTY_ABSENT}=true (it must not be set)"
        )
    _check_text(IF_PROPERTY, key, MAX_PROPERTY_KEY_BYTES)
    if value is not None:
        _check_text(IF_PROPERTY_VALUE, value, MAX_PROPERTY_VALUE_BYTES)
        return PropertyPrecondition.equals(key, value)
    if absent != "true":
        raise ValueError(
            f"{IF_PROPERTY_ABSENT}: {_cut(str(absent))!r} is not true (leave it out, and give "
            f"{IF_PROPERTY_VALUE}, for a property that must be set)"
        )
    return PropertyPrecondition.absent(key)


def _check_text(name: str, text: str, limit: int) -> None:
    if not text:
        raise ValueError(
            f"{name} is empty; a precondition names a property and a non-empty value "
            f"({IF_PROPERTY_ABSENT}=true for a property that must not be set)"
        )
    try:
        length = utf8_length(text)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from e
    if length > limit:
        raise ValueError(f"{name} is {length} bytes; a property's is at most {limit}")
