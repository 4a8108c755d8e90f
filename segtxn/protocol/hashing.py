"""Key hashing: every key maps to a point of the hash space 0x0000-0xFFFF.

Range segments split this space; a keyed message goes to the segment whose range covers
its key's hash. Client and broker must agree, so this is the one definition.
"""

from __future__ import annotations

import hashlib

HASH_SPACE = 0x10000


def key_hash(key: str | bytes) -> int:
    """A stable 16-bit hash of ``key`` (BLAKE2b, first two bytes, big-endian)."""
    data = key.encode() if isinstance(key, str) else key
    return int.from_bytes(hashlib.blake2b(data, digest_size=2).digest(), "big")
