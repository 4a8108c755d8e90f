"""Noticing that files changed on disk without reading them, for credentials a server
reloads while it runs (:mod:`segtxn.auth.tls`, :mod:`segtxn.metastore.etcd_credentials`).

A stamp is each file's modification time, size and inode: a rewrite in place changes the
time or the size, and a Kubernetes Secret update swaps a symlink, which changes the inode.
Comparing the stamp with the last load's costs a ``stat`` per file, no read.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

FileStamp = tuple[float, int, int] | None
"""(modification time, size, inode); None when the file cannot be looked at (missing,
or caught between the two steps of a swap)."""

Stamp = tuple[FileStamp, ...]


def stamp(paths: Iterable[Path]) -> Stamp:
    """The stamps of ``paths``, in order."""
    return tuple(_one(path) for path in paths)


def _one(path: Path) -> FileStamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime, st.st_size, st.st_ino)
