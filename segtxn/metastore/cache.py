"""What the metadata store remembers about physical keys: a bounded guess, never the truth.

To know which index entries a write must remove, and which version a write must compare,
the store remembers, for each physical key it has recently read or written, its
``mod_revision``, ``create_revision`` and index entries (:class:`Known`), and, for each
prefix of sequential keys, the last number assigned. At most ``cache_entries`` of each
(:class:`~segtxn.metastore.settings.StoreSettings`) are kept, least recently used out first.

The cache is only ever a guess: every transaction compares the ``mod_revision`` of each key
it touches, and a failed compare reads the truth in the same round trip
(:mod:`segtxn.metastore.plan`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from segtxn.metastore import keys as K
from segtxn.metastore.engine import KeyValue


@dataclass(frozen=True, slots=True)
class Known:
    """What the store believes about one physical key."""

    mod: int
    created: int
    indexes: Mapping[str, bytes]  # index name -> encoded index key


ABSENT = Known(0, 0, {})
"""What the store believes about a key that does not exist."""


class KeyCache:
    """The store's bounded cache of physical keys (see the module docstring)."""

    def __init__(self, max_entries: int) -> None:
        self.known: OrderedDict[bytes, Known] = OrderedDict()
        self.counters: OrderedDict[bytes, int] = OrderedDict()  # prefix -> last number
        self._max_entries = max_entries

    def learn_all(self, raws: Sequence[bytes], found: Sequence[KeyValue | int | None]) -> None:
        """Learn what a transaction's ``GetOp`` of each of ``raws`` found (None: nothing)."""
        for raw, kv in zip(raws, found, strict=True):
            self.learn(raw, None if isinstance(kv, int) else kv)

    def learn(self, raw: bytes, kv: KeyValue | None) -> None:
        """Learn the state of ``raw``, a record or a sequence counter (None: absent)."""
        if kv is None:
            self.remember(raw, ABSENT)
            if raw.startswith(K.SEQUENCE_ROOT):
                self.counters.pop(raw[len(K.SEQUENCE_ROOT) :], None)
            return
        if raw.startswith(K.SEQUENCE_ROOT):
            prefix = raw[len(K.SEQUENCE_ROOT) :]
            self.counters[prefix] = int(kv.value or b"0")
            self.remember(raw, Known(kv.mod_revision, kv.create_revision, {}))
            return
        _, indexes = K.unpack_value(kv.value)
        self.remember(raw, Known(kv.mod_revision, kv.create_revision, indexes))

    def remember(self, raw: bytes, known: Known) -> None:
        """Remember ``known`` as the state of ``raw``, forgetting the least recently used
        keys (and counters) beyond ``max_entries``."""
        self.known[raw] = known
        self.known.move_to_end(raw)
        while len(self.known) > self._max_entries:
            self.known.popitem(last=False)
        while len(self.counters) > self._max_entries:
            self.counters.popitem(last=False)
