"""Key validation and the store's physical layout: its keys, and what a record's key holds.

User keys are UTF-8 paths that start with ``/``. Everything the store keeps for its own
bookkeeping lives in a separate physical keyspace that sorts *before* ``/`` (it starts with
``\\x01``), so a user range ``[lo, hi)`` with ``lo >= "/"`` can never include it:

- ``\\x01i/<index>/<encoded index key>\\x00\\x00<primary key>``: one secondary-index entry.
  Its value is a copy of the record's value (a covering index), so an index range needs no
  second read.
- ``\\x01s<prefix>``: the counter behind ``sequential=True`` keys under ``<prefix>``.

A record's own key holds ``\\x00`` + its value or, for a record in some index, ``\\x01`` +
msgpack ``(value, {index name: encoded index key})`` (:func:`pack_value`): reading a record
tells which index entries a later write of it must remove.

Index keys are tuples of ``str`` and non-negative ``int`` components, encoded so that byte
order equals tuple order: each component is tagged (``i`` + 20 decimal digits, or ``s`` +
the string), components are joined by ``\\x00\\x01`` and the primary key follows after
``\\x00\\x00``. A tuple sorts before every tuple it is a proper prefix of, exactly as in
Python.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import msgspec

from segtxn.metastore.errors import InvalidKey

MAX_KEY_BYTES = 1024
MAX_INT_COMPONENT = 10**20 - 1
SEQUENCE_DIGITS = 20

IndexKey = tuple[str | int, ...]

INDEX_ROOT = b"\x01i/"
SEQUENCE_ROOT = b"\x01s"
_COMPONENT_SEP = b"\x00\x01"
_PRIMARY_SEP = b"\x00\x00"
_INDEX_NAME = re.compile(r"^[a-z0-9][a-z0-9:_.-]{0,63}$")


def check_key(key: str, *, what: str = "key") -> bytes:
    """Return the physical bytes of a user key, or raise ``InvalidKey``."""
    if not isinstance(key, str):
        raise InvalidKey(f"{what} must be a str, not {type(key).__name__}")
    if not key.startswith("/"):
        raise InvalidKey(f"{what} {key!r} must start with '/'")
    if "\x00" in key:
        raise InvalidKey(f"{what} {key!r} must not contain NUL characters")
    try:
        raw = key.encode("utf-8", errors="strict")
    except UnicodeEncodeError as e:  # (a lone surrogate)
        raise InvalidKey(f"{what} {key!r} is not valid UTF-8: {e.reason}") from e
    if len(raw) > MAX_KEY_BYTES:
        raise InvalidKey(f"{what} is {len(raw)} bytes long; the limit is {MAX_KEY_BYTES}")
    return raw


def check_range(lo: str, hi: str) -> tuple[bytes, bytes]:
    """Validate a half-open user range ``[lo, hi)`` and return its physical bounds."""
    raw_lo = check_key(lo, what="range start")
    raw_hi = check_key(hi, what="range end")
    if raw_hi <= raw_lo:
        raise InvalidKey(f"empty or inverted range [{lo!r}, {hi!r})")
    return raw_lo, raw_hi


def prefix_end(prefix: bytes) -> bytes:
    """The smallest byte string greater than every string that starts with ``prefix``."""
    buf = bytearray(prefix)
    while buf:
        if buf[-1] < 0xFF:
            buf[-1] += 1
            return bytes(buf)
        buf.pop()
    raise InvalidKey("a prefix of only 0xff bytes has no end")


def check_index_name(name: str) -> bytes:
    if not isinstance(name, str) or not _INDEX_NAME.match(name):
        raise InvalidKey(
            f"index name {name!r} must match {_INDEX_NAME.pattern} (lowercase, no '/')"
        )
    return name.encode()


def normalize_index_key(value: str | int | Sequence[str | int]) -> IndexKey:
    """Accept a bare component or a sequence of components and return a tuple."""
    if isinstance(value, str | int):
        return (value,)
    if not isinstance(value, tuple | list):
        raise InvalidKey(f"an index key is a str, an int or a tuple of them, not {value!r}")
    return tuple(value)


def encode_index_key(key: IndexKey) -> bytes:
    """Encode an index key so that byte order equals tuple order (see module docstring)."""
    parts: list[bytes] = []
    for component in key:
        if isinstance(component, bool):
            raise InvalidKey("index key components may be str or int, not bool")
        if isinstance(component, int):
            if not 0 <= component <= MAX_INT_COMPONENT:
                raise InvalidKey(f"index key int {component} is outside 0..{MAX_INT_COMPONENT}")
            parts.append(b"i%020d" % component)
        elif isinstance(component, str):
            if "\x00" in component:
                raise InvalidKey(f"index key component {component!r} contains NUL")
            try:
                parts.append(b"s" + component.encode())
            except UnicodeEncodeError as e:  # (a lone surrogate)
                raise InvalidKey(f"index key component {component!r} is not valid UTF-8") from e
        else:
            raise InvalidKey(f"index key components may be str or int, not {type(component)}")
    return _COMPONENT_SEP.join(parts)


def decode_index_key(raw: bytes) -> IndexKey:
    if not raw:
        return ()
    out: list[str | int] = []
    for part in raw.split(_COMPONENT_SEP):
        tag, body = part[:1], part[1:]
        out.append(int(body) if tag == b"i" else body.decode())
    return tuple(out)


def index_prefix(name: bytes) -> bytes:
    """Physical prefix of every entry of one index."""
    return INDEX_ROOT + name + b"/"


def index_entry_key(name: bytes, encoded_key: bytes, primary: bytes) -> bytes:
    return index_prefix(name) + encoded_key + _PRIMARY_SEP + primary


def split_index_entry_key(name: bytes, raw: bytes) -> tuple[IndexKey, str]:
    """Inverse of :func:`index_entry_key`: the index key and the primary key."""
    body = raw[len(index_prefix(name)) :]
    encoded, _, primary = body.partition(_PRIMARY_SEP)
    return decode_index_key(encoded), primary.decode()


def checked_index_bounds(
    index: str, lo: str | int | Sequence[str | int], hi: str | int | Sequence[str | int] | None
) -> tuple[bytes, bytes, bytes]:
    """The checked name of ``index`` and the physical bounds of ``[lo, hi)`` in it."""
    name = check_index_name(index)
    hi_key = None if hi is None else normalize_index_key(hi)
    return name, *index_bounds(name, normalize_index_key(lo), hi_key)


def index_bounds(name: bytes, lo: IndexKey, hi: IndexKey | None) -> tuple[bytes, bytes]:
    """Physical bounds for index keys in ``[lo, hi)``; ``hi=None`` means "every key that
    starts with the components of ``lo``" (an equality match on a tuple prefix)."""
    base = index_prefix(name)
    if hi is None:
        encoded = encode_index_key(lo)
        if not lo:
            return base, prefix_end(base)
        # Entries of exactly `lo` continue with _PRIMARY_SEP, longer tuples with
        # _COMPONENT_SEP; both start with b"\x00", and nothing else follows `lo` itself.
        return base + encoded + b"\x00", base + encoded + b"\x01"
    raw_lo, raw_hi = base + encode_index_key(lo), base + encode_index_key(hi)
    if raw_hi <= raw_lo:
        raise InvalidKey(f"empty or inverted index range [{lo!r}, {hi!r})")
    return raw_lo, raw_hi


def sequence_counter_key(prefix: bytes) -> bytes:
    return SEQUENCE_ROOT + prefix


def sequential_key(prefix: str, number: int) -> str:
    return f"{prefix}{number:0{SEQUENCE_DIGITS}d}"


_PLAIN = b"\x00"
_INDEXED = b"\x01"
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(tuple[bytes, dict[str, bytes]])


def pack_value(value: bytes, indexes: Mapping[str, bytes]) -> bytes:
    """What a record's key holds: its value and its (encoded) index keys."""
    if not indexes:
        return _PLAIN + value
    return _INDEXED + _encoder.encode((value, dict(indexes)))


def unpack_value(raw: bytes) -> tuple[bytes, dict[str, bytes]]:
    """Inverse of :func:`pack_value`: the value and the encoded index keys by name."""
    if raw[:1] == _INDEXED:
        value, indexes = _decoder.decode(raw[1:])
        return value, indexes
    return raw[1:], {}
