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
from segtxn.metastore.settings import StoreSettings
from segtxn.metastore.store import MetadataStore

EngineFactory = Callable[[str, StoreSettings], Engine]
UrlCheck = Callable[[str], None]
_SCHEMES: dict[str, EngineFactory] = {}
_CHECKS: dict[str, UrlCheck] = {}


def register_scheme(scheme: str, factory: EngineFactory, check: UrlCheck | None = None) -> None:
    """Make ``scheme://...`` URLs open engines made by ``factory(url, settings)``;
    ``check(url)`` (optional) refuses a malformed URL with ``InvalidArgument`` without
    opening anything."""
    _SCHEMES[scheme] = factory
    if check is not None:
        _CHECKS[scheme] = check


def check_url(url: str) -> None:
    """Refuse a store URL that :func:`open_store` could never open, without opening it or
    reaching anything (command lines check their flags with it).

    Raises:
        InvalidArgument: unknown scheme or malformed URL; the message says what is expected.
    """
    try:
        scheme = urlsplit(url).scheme
        if scheme not in _SCHEMES:
            known = ", ".join(f"{s}://" for s in sorted(_SCHEMES))
            raise InvalidArgument(f"unknown metadata store URL {url!r}; known schemes: {known}")
        check = _CHECKS.get(scheme)
        if check is not None:
            check(url)
    except ValueError as e:  # (urlsplit's, for an unclosed IPv6 bracket)
        raise InvalidArgument(f"metadata store URL {url!r} is malformed: {e}") from e


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
    check_url(url)
    engine = _SCHEMES[urlsplit(url).scheme](url, settings)
    return MetadataStore(wrap(engine) if wrap else engine, settings)


def _check_memory(url: str) -> None:
    parts = urlsplit(url)
    if parts.netloc or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise InvalidArgument(f"{url!r}: a memory store URL is just 'memory://'")


def _memory(url: str, settings: StoreSettings) -> Engine:
    from segtxn.metastore.memory import MemoryEngine

    if settings.credentials.enabled:
        raise InvalidArgument(
            "memory:// is in this process: it takes no TLS files, user or password"
        )
    return MemoryEngine()


ETCD_FORM = "etcd://host:port[,host:port...][/namespace]"


def _check_etcd(url: str) -> None:
    from segtxn.metastore.etcd import namespace_bytes, parse_endpoints

    parts = urlsplit(url)
    endpoints = parse_endpoints(parts.netloc)
    if not endpoints or parts.query or parts.fragment:
        raise InvalidArgument(f"{url!r}: expected {ETCD_FORM}")
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidArgument(f"{url!r}: {endpoint!r} is not host:port (port 1-65535)")
    try:
        namespace_bytes(parts.path)
    except InvalidArgument as e:
        raise InvalidArgument(f"{url!r}: bad namespace {parts.path!r}: {e}") from e


def _etcd(url: str, settings: StoreSettings) -> Engine:
    from segtxn.metastore.etcd import EtcdEngine, namespace_bytes, parse_endpoints

    parts = urlsplit(url)
    return EtcdEngine(
        parse_endpoints(parts.netloc),
        namespace_bytes(parts.path),
        request_timeout_s=settings.request_timeout_s,
        credentials=settings.credentials,
    )


register_scheme("memory", _memory, _check_memory)
register_scheme("etcd", _etcd, _check_etcd)
