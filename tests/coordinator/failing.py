"""A method made to fail once, and the kinds of failure a coordinator's loops meet, for the
tests of those loops (test_v4_sweep_edges, test_loop_edges)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from segtxn.metastore import MetadataStoreError
from segtxn.protocol.errors import ErrorName, ServerError

FAILURES: dict[str, Callable[[], BaseException]] = {
    "store": lambda: MetadataStoreError("injected: the store is away"),
    "server": lambda: ServerError(ErrorName.SERVICE_NOT_READY, "injected: the id moved"),
    "bug": lambda: RuntimeError("injected: a bug"),
    "damage": lambda: ValueError("injected: a damaged record"),
}


class FailsOnce:
    """Wraps ``owner.name`` (an async method) so that its first call for which
    ``when(*args)`` holds raises ``error``; ``failed`` is set once it has."""

    def __init__(
        self, owner: object, name: str, error: BaseException, when: Callable[..., bool]
    ) -> None:
        self.failed = asyncio.Event()
        self._method: Callable[..., Awaitable[Any]] = getattr(owner, name)
        self._error, self._when = error, when
        setattr(owner, name, self)

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.failed.is_set() and self._when(*args, **kwargs):
            self.failed.set()
            raise self._error
        return await self._method(*args, **kwargs)
