"""Where a broker's ledgers live, chosen by URL like the metadata store.

``file:///var/lib/segtxn/ledgers`` (or a bare path) keeps entry logs in files under that
directory; ``memory://`` keeps them in the process (tests, throwaway standalone runs).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from segtxn.ledger.files import FileLogStorage
from segtxn.ledger.logs import LogStorage
from segtxn.ledger.memory import MemoryLogStorage


def open_log_storage(url: str) -> LogStorage:
    """A log storage for ``file:///dir``, a plain directory path, or ``memory://``.

    Raises:
        ValueError: an unknown scheme.
    """
    parts = urlsplit(url)
    if parts.scheme == "memory":
        return MemoryLogStorage()
    if parts.scheme == "file":
        return FileLogStorage(Path(parts.path))
    if parts.scheme == "":
        return FileLogStorage(Path(url))
    raise ValueError(f"unknown ledger storage URL {url!r}: use file:///dir or memory://")
