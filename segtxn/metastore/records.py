"""What callers of the metadata store hand in and get back: records, operations, events.

These are plain frozen values. ``version`` is always a *store revision* (etcd's
``mod_revision``), not a per-key counter: a key that is deleted and created again never
reuses a version, so a compare-and-set can never be fooled by an ABA sequence.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from segtxn.metastore.keys import IndexKey

if TYPE_CHECKING:
    from segtxn.metastore.session import Session

MUST_NOT_EXIST = 0
"""``expected_version`` meaning "the key must not exist" (a create)."""


@dataclass(frozen=True, slots=True)
class Record:
    key: str
    value: bytes
    version: int
    """The revision that last wrote this record."""
    created_version: int
    """The revision that created it (unchanged by later puts)."""
    indexes: Mapping[str, IndexKey] = field(default_factory=dict)
    """The secondary-index entries the store maintains for it."""
    session_id: int = 0
    """The session (lease) id of an ephemeral record, 0 for a durable one."""


@dataclass(frozen=True, slots=True)
class Put:
    """Write ``value`` at ``key`` (see :meth:`MetadataStore.put` for each field)."""

    key: str
    value: bytes
    expected_version: int | None = None
    sequential: bool = False
    partition_key: str | None = None
    indexes: Mapping[str, str | int | tuple[str | int, ...]] | None = None
    session: Session | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete ``key`` (see :meth:`MetadataStore.delete`)."""

    key: str
    expected_version: int | None = None


@dataclass(frozen=True, slots=True)
class Check:
    """Write nothing; make the whole atomic step fail unless ``key`` is at
    ``expected_version`` (``MUST_NOT_EXIST`` for "absent")."""

    key: str
    expected_version: int


Op = Put | Delete | Check


class EventKind(enum.Enum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    kind: EventKind
    key: str
    revision: int
    """The revision of the change. All changes of one atomic step share it."""
    record: Record | None
    """The record as written, for PUT; None for DELETE."""


@dataclass(frozen=True, slots=True)
class IndexEntry:
    index_key: IndexKey
    key: str
    """The primary key of the indexed record."""
    value: bytes
    """A copy of the record's value, written in the same atomic step as the record."""
    version: int


@dataclass(frozen=True, slots=True)
class IndexEvent:
    kind: EventKind
    index_key: IndexKey
    key: str
    revision: int
    entry: IndexEntry | None
    """The new entry for PUT; None for DELETE."""


@dataclass(frozen=True, slots=True)
class Listing:
    records: list[Record]
    revision: int
    """The revision the listing was read at: watch from ``revision + 1`` to follow it."""
    more: bool
    """True when ``limit`` cut the listing short; continue after the last key."""


@dataclass(frozen=True, slots=True)
class IndexListing:
    entries: list[IndexEntry]
    revision: int
    more: bool
