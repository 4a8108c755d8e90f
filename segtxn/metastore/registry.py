"""URL-scheme registry: ``memory://`` and ``etcd://host:port[,host:port][/namespace]``.

Components never construct a backend themselves; they are handed a URL (from a CLI flag, a
Helm value, a CR) and call :func:`open_store`. A new backend registers a factory for its
scheme with :func:`register_scheme`.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from segtxn.metastore.engine import Engine
from segtxn.metastore.errors import InvalidArgument
from segtxn.metastore.store import MetadataStore, StoreSettings

EngineFactory = Callable[[str, StoreSettings], Engine]
_SCHEMES: dict[str, EngineFactory] = {}


def register_scheme(scheme: str, factory: EngineFactory) -> None:
    """Make ``scheme://...`` URLs open engines made by ``factory(url, settings)``."""
    _SCHEMES[scheme] = factory


def open_store(
    url: str,
    settings: StoreSettings | None = None,
    *,
    wrap: Callable[[Engine], Engine] | None = None,
) -> MetadataStore:
    """Open a metadata store from its URL.

    Args:
        url: ``memory://`` (a new, private, in-process store) or
            ``etcd://host:port[,host:port...][/namespace]``.
        settings: limits and tuning; defaults are the production defaults.
        wrap: wraps the engine before use (the tests' fault injector goes here).

    Raises:
        InvalidArgument: unknown scheme or malformed URL.
    """
    settings = settings or StoreSettings()
    scheme = urlsplit(url).scheme
    factory = _SCHEMES.get(scheme)
    if factory is None:
        known = ", ".join(f"{s}://" for s in sorted(_SCHEMES))
        raise InvalidArgument(f"unknown metadata store URL {url!r}; known schemes: {known}")
    engine = factory(url, settings)
    return MetadataStore(wrap(engine) if wrap else engine, settings)


def _memory(url: str, settings: StoreSettings) -> Engine:
    from segtxn.metastore.memory import MemoryEngine

    parts = urlsplit(url)
    if parts.netloc or parts.path not in ("", "/"):
        raise InvalidArgument(f"{url!r}: a memory store URL is just 'memory://'")
    return MemoryEngine()


def _etcd(url: str, settings: StoreSettings) -> Engine:
    from segtxn.metastore.etcd import EtcdEngine, namespace_bytes, parse_endpoints

    parts = urlsplit(url)
    endpoints = parse_endpoints(parts.netloc)
    if not endpoints:
        raise InvalidArgument(f"{url!r}: expected etcd://host:port[,host:port][/namespace]")
    return EtcdEngine(
        endpoints, namespace_bytes(parts.path), request_timeout_s=settings.request_timeout_s
    )


register_scheme("memory", _memory)
register_scheme("etcd", _etcd)
