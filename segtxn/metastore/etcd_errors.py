"""How the ``etcd://`` backend reads etcd's gRPC failures: each status and message mapped
to the store's own error tree (:mod:`segtxn.metastore.errors`), so callers catch
``StoreUnavailable``, ``StoreAccessDenied``, ``StoreFull``... and never compare strings."""

from __future__ import annotations

import grpc

from segtxn.metastore.errors import (
    Compacted,
    InvalidArgument,
    MetadataStoreError,
    SessionExpired,
    StoreAccessDenied,
    StoreFull,
    StoreUnavailable,
    TooLarge,
    TooManyOperations,
)

_UNAVAILABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
}


_TOKEN_GONE = ("invalid auth token", "revision in header is old")
"""etcd's refusals of a token it no longer knows (expired, another member's, issued before
a change of users or roles): authenticating again helps."""
_DENIED = ("authentication failed", "user name is empty", "permission denied")


def authentication_off(e: grpc.aio.AioRpcError) -> bool:
    """Whether etcd refused an ``Authenticate`` because its authentication is off."""
    return "authentication is not enabled" in (e.details() or "")


def refused(e: grpc.aio.AioRpcError) -> bool:
    """Whether etcd refused the call's credentials or permissions (``StoreAccessDenied``)."""
    return isinstance(map_grpc_error(e), StoreAccessDenied)


def token_gone(e: grpc.aio.AioRpcError) -> bool:
    """Whether etcd refused the call's token as one it no longer honours."""
    details = e.details() or ""
    return any(text in details for text in _TOKEN_GONE)


def map_watch_cancel(reason: str) -> MetadataStoreError:
    """Translate the reason etcd gives for cancelling a watch it did not confirm or keep:
    "permission denied" (the user may not read the range) is ``StoreAccessDenied``, as the
    same refusal of a read is; anything else is ``StoreUnavailable`` (the watch is made
    again)."""
    reason = reason or "no reason given"
    if any(text in reason for text in _DENIED):
        return StoreAccessDenied(f"etcd refused the watch: {reason}")
    return StoreUnavailable(f"etcd cancelled the watch: {reason}")


def map_grpc_error(e: grpc.aio.AioRpcError) -> MetadataStoreError:
    """Translate an etcd gRPC failure into the store's error tree."""
    code, details = e.code(), e.details() or ""
    if token_gone(e):
        return StoreUnavailable(f"etcd refused the session's token ({details}); it is renewed")
    if code == grpc.StatusCode.PERMISSION_DENIED or any(text in details for text in _DENIED):
        hint = (
            " (etcd has authentication on: give a user and its password)"
            if "user name is empty" in details
            else ""
        )
        return StoreAccessDenied(f"etcd refused the credentials: {details}{hint}")
    if "database space exceeded" in details:  # the NOSPACE alarm: until an operator acts
        return StoreFull(f"etcd refused the write: {details} (its NOSPACE alarm is raised)")
    if "too many operations" in details:
        return TooManyOperations(f"etcd refused the transaction: {details}")
    if "request is too large" in details or (
        code == grpc.StatusCode.RESOURCE_EXHAUSTED
        and ("message larger than max" in details or "received message larger" in details)
    ):
        return TooLarge(f"etcd refused the request: {details}")
    if "lease not found" in details:
        return SessionExpired(f"etcd: {details}")
    if "compacted" in details:
        return Compacted(0)
    if "future revision" in details:
        return InvalidArgument(f"etcd: {details}")
    if code in _UNAVAILABLE:
        return StoreUnavailable(f"etcd did not answer ({code.name}): {details}")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidArgument(f"etcd refused the request: {details}")
    return StoreUnavailable(f"etcd failed ({code.name}): {details}")
