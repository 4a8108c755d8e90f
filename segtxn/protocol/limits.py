"""Every size, count and range a segtxn server accepts, in one place.

A limit is checked once, at the edge (the HTTP handler or the frame reader), and is chosen so
that it holds on every layer beneath (STYLE #20): a name the API accepts fits a file name on
disk (255 bytes, including the ledger's own names derived from it), and a store key (1 KiB,
:mod:`segtxn.metastore.keys`); a property set fits one store value (1 MiB; etcd takes 1.5 MiB
per request); a message's key and properties fit the room its ledger entry keeps beside the
payload (64 KiB). docs/protocol.md lists them in one table; keep the two in step.

Name lengths are *storage lengths*: names are URL-quoted in file names and store keys, so a
``=`` or ``:`` takes three bytes there and counts as three here (letters, digits, ``-_.`` count
one). The binding case is a v4 subscription's pending-ack log on a ``persistent://`` topic:
its file name is ``persistent%3A%2F%2F`` + tenant, namespace, name (``%2F`` between) + ``-`` +
subscription + ``__transaction_pending_ack``, i.e. 51 + parts + subscription <= 255 bytes; and
the namespace's transaction-buffer snapshot log, 57 + tenant + namespace + broker id (<= 63)
<= 255 bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote

from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.hashing import HASH_SPACE

# ---------------------------------------------------------------------- HTTP

MAX_REQUEST_BYTES = 1 << 20
"""Largest request body (the biggest body is a property set, itself <= 64 KiB of text)."""
MAX_LINE_BYTES = 8190
"""Longest request line (method, path and query) and longest header line (aiohttp's)."""
MAX_HEADERS = 128
MAX_JSON_DEPTH = 32
"""Deepest nesting of arrays and objects in a JSON body (every body segtxn takes has 2)."""
MAX_ERROR_MESSAGE_CHARS = 1000
"""Error messages are cut here: they often quote the request back."""

# ---------------------------------------------------------------------- names

FILE_NAME_BYTES = 255
"""NAME_MAX of Linux file systems: one ledger directory name."""
MAX_TENANT = 64
MAX_NAMESPACE = 64
MAX_LOCAL_NAME = 128
MAX_TOPIC_PARTS = 140
"""Tenant, namespace and name together (storage lengths, separators not counted)."""
MAX_SEGMENT_ID_DIGITS = 18
MAX_SEGMENT_ID = 10**MAX_SEGMENT_ID_DIGITS - 1
MAX_SUBSCRIPTION = 64
MAX_CLIENT_NAME = 128
"""Producer and consumer names (they go into entries and memory, never into file names)."""

PENDING_ACK_LOG_OVERHEAD = 51
"""``persistent%3A%2F%2F`` + two ``%2F`` + ``-`` + ``__transaction_pending_ack``."""
SNAPSHOT_LOG_OVERHEAD = 57
"""``persistent%3A%2F%2F``, ``%2F`` x2, ``__transaction_buffer_snapshot``, ``%40``."""
MAX_BROKER_ID = 63
SEGMENT_LEDGER_OVERHEAD = 25
"""``segment%3A%2F%2F`` + three ``%2F``."""

# ---------------------------------------------------------------------- properties

MAX_PROPERTIES = 128
MAX_PROPERTY_KEY_BYTES = 256
MAX_PROPERTY_VALUE_BYTES = 8192
MAX_PROPERTIES_BYTES = 64 * 1024
"""Keys and values of a topic's properties together (UTF-8)."""

# ---------------------------------------------------------------------- messages and frames

MAX_MESSAGE_KEY_BYTES = 8 * 1024
MAX_MESSAGE_METADATA_BYTES = 48 * 1024
"""A message's key and properties together: its entry keeps 64 KiB beside the payload."""
DEFAULT_MAX_MESSAGE_BYTES = 5 * 1024 * 1024 - 64 * 1024
"""A broker's largest payload unless its settings say otherwise: a 5 MiB entry less the
64 KiB kept for the message's metadata (``BrokerSettings.max_message_bytes``)."""
MAX_BATCH_SENDS = 1000
MAX_MESSAGE_IDS = 10_000
"""Message ids in one ack or nack."""

# ---------------------------------------------------------------------- numbers

MAX_U64 = (1 << 64) - 1
"""Sequence ids, request ids and transaction id halves: unsigned 64-bit."""
MAX_I64 = (1 << 63) - 1
"""Positions (ledger and entry ids), epochs and times in ms: signed 64-bit, never negative."""
MAX_LIST_LIMIT = 10_000
"""``limit`` of a listing (``GET /txn/v2/open``)."""
MAX_TOPICS_PER_CALL = 1000
"""Topics in one ADD_PARTITION / ADD_SUBSCRIPTION call."""
MAX_NEW_TXNS = 16
"""``count`` of one NEW_TXN (v5): its headers go in one store step, with their index
entries and the fencing check well within etcd's 128 operations."""
MAX_TXN_PARTICIPANTS = 1000
"""Partitions plus subscriptions of one v4 transaction (its whole metadata is logged at
each change, and END_TXN fans out to each)."""


def storage_length(text: str) -> int:
    """How long ``text`` is in file names and store keys (URL-quoted, UTF-8)."""
    return len(quote(text, safe="", errors="surrogatepass"))


def utf8_length(text: str) -> int:
    """UTF-8 length of ``text``; raises ValueError for a lone surrogate (not Unicode)."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError(f"{_cut(text)!r} is not valid Unicode (a lone surrogate)") from None


def _cut(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def properties_problem(properties: Mapping[str, str]) -> str | None:
    """What is wrong with a topic's property set (checked on the set a change would write),
    or None."""
    total = 0
    for key, value in properties.items():
        try:
            key_bytes, value_bytes = utf8_length(key), utf8_length(value)
        except ValueError as e:
            return f"property {_cut(key)!r}: {e}"
        if not key:
            return "a property key must not be empty"
        if key_bytes > MAX_PROPERTY_KEY_BYTES:
            return f"property key {_cut(key)!r} is over {MAX_PROPERTY_KEY_BYTES} bytes"
        if value_bytes > MAX_PROPERTY_VALUE_BYTES:
            return f"property {_cut(key)!r}: its value is over {MAX_PROPERTY_VALUE_BYTES} bytes"
        total += key_bytes + value_bytes
    if len(properties) > MAX_PROPERTIES:
        return f"{len(properties)} properties; at most {MAX_PROPERTIES}"
    if total > MAX_PROPERTIES_BYTES:
        return f"properties take {total} bytes; at most {MAX_PROPERTIES_BYTES}"
    return None


def parse_int(text: str, what: str, *, lo: int = 0, hi: int = MAX_I64) -> int:
    """A decimal number of ASCII digits (and an optional leading ``-``) in ``[lo, hi]``.

    Raises:
        ServerError(InvalidArgument): anything else (``int()`` would take ``"1_0"``,
            ``" 7"`` and digits of other scripts).
    """
    digits = text.removeprefix("-")
    if not (digits.isascii() and digits.isdigit()):
        raise ServerError(ErrorName.INVALID_ARGUMENT, f"{what}: {_cut(text)!r} is not a number")
    if len(digits) > 20:
        raise ServerError(ErrorName.INVALID_ARGUMENT, f"{what} must be in {lo}..{hi}")
    value = int(text)
    if not lo <= value <= hi:
        raise ServerError(ErrorName.INVALID_ARGUMENT, f"{what} must be in {lo}..{hi}, not {value}")
    return value


def parse_float(text: str, what: str) -> float:
    """A decimal number of ASCII digits, with a point or an exponent (``60``, ``0.5``,
    ``1e-05``: what Python's ``str`` of a float gives).

    Raises:
        ServerError(InvalidArgument): anything else (``float()`` would take ``"1_0"``,
            ``" 7"``, ``"nan"``, ``"inf"`` and digits of other scripts).
    """
    if not text or not text.isascii() or text.strip("0123456789.eE+-"):
        raise ServerError(ErrorName.INVALID_ARGUMENT, f"{what}: {_cut(text)!r} is not a number")
    try:
        return float(text)
    except ValueError:
        raise ServerError(
            ErrorName.INVALID_ARGUMENT, f"{what}: {_cut(text)!r} is not a number"
        ) from None


def parse_bool(text: str, what: str) -> bool:
    """``true`` or ``false``, exactly: a boolean query parameter (``?force=true``).

    Raises:
        ServerError(InvalidArgument): anything else; ``yes``, ``1``, ``TRUE`` or ``on``
            must not count as false without a word (a ``DELETE ...?force=yes`` that was
            refused for connected clients said nothing of its ``force``).
    """
    if text == "true":
        return True
    if text == "false":
        return False
    raise ServerError(ErrorName.INVALID_ARGUMENT, f"{what}: {_cut(text)!r} is not true or false")


def parse_key_hash(text: str, what: str) -> int:
    """A point of the key-hash space, 0..0xFFFF: decimal (as :func:`parse_int`) or ``0x``
    and one to four hex digits (hashes are shown in hex: ``0x8000``).

    Raises:
        ServerError(InvalidArgument): anything else (``int(text, 0)`` would take ``"1_0"``,
            ``"0o17"``, ``"+3"`` and digits of other scripts).
    """
    hi = HASH_SPACE - 1
    if text[:2] not in ("0x", "0X"):
        return parse_int(text, what, hi=hi)
    digits = text[2:]
    if not 1 <= len(digits) <= 4 or digits.strip("0123456789abcdefABCDEF"):
        raise ServerError(
            ErrorName.INVALID_ARGUMENT, f"{what}: {_cut(text)!r} is not a hash (0x0000-0x{hi:x})"
        )
    return int(digits, 16)


def parse_position(text: str, what: str) -> tuple[int, int]:
    """``LEDGER:ENTRY`` with both in 0..2^63-1.

    Raises:
        ServerError(InvalidArgument)
    """
    ledger, sep, entry = text.partition(":")
    if not sep:
        raise ServerError(ErrorName.INVALID_ARGUMENT, f"{what}: {_cut(text)!r} is not LEDGER:ENTRY")
    return parse_int(ledger, f"{what} ledger id"), parse_int(entry, f"{what} entry id")
