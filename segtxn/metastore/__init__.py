"""segtxn's metadata store: the source of truth for every piece of shared state.

Open one with :func:`open_store` (``memory://`` or ``etcd://host:port[,...][/namespace]``);
see :class:`MetadataStore` for the contract and :mod:`segtxn.metastore.engine` for what a
backend must provide.
"""

from segtxn.metastore import grpc_fork  # noqa: F401  (imported first, for its effect)
from segtxn.metastore.election import LeaderElection, Leadership
from segtxn.metastore.errors import (
    AlreadyExists,
    BadVersion,
    Compacted,
    InvalidArgument,
    InvalidKey,
    MetadataStoreError,
    NotFound,
    SessionExpired,
    StoreAccessDenied,
    StoreClosed,
    StoreFull,
    StoreUnavailable,
    TooLarge,
    TooManyOperations,
)
from segtxn.metastore.reach import access_denied, wait_reachable
from segtxn.metastore.records import (
    MUST_NOT_EXIST,
    Check,
    Delete,
    EventKind,
    IndexEntry,
    IndexEvent,
    IndexListing,
    Listing,
    Op,
    Put,
    Record,
    WatchEvent,
)
from segtxn.metastore.registry import check_url, open_store, register_scheme
from segtxn.metastore.session import Session
from segtxn.metastore.settings import StoreCredentials, StoreSettings
from segtxn.metastore.store import MetadataStore

__all__ = [
    "MUST_NOT_EXIST",
    "AlreadyExists",
    "BadVersion",
    "Check",
    "Compacted",
    "Delete",
    "EventKind",
    "IndexEntry",
    "IndexEvent",
    "IndexListing",
    "InvalidArgument",
    "InvalidKey",
    "LeaderElection",
    "Leadership",
    "Listing",
    "MetadataStore",
    "MetadataStoreError",
    "NotFound",
    "Op",
    "Put",
    "Record",
    "Session",
    "SessionExpired",
    "StoreAccessDenied",
    "StoreClosed",
    "StoreCredentials",
    "StoreFull",
    "StoreSettings",
    "StoreUnavailable",
    "TooLarge",
    "TooManyOperations",
    "WatchEvent",
    "access_denied",
    "check_url",
    "open_store",
    "register_scheme",
    "wait_reachable",
]
