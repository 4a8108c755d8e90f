"""The ``etcd://`` backend: the engine contract on a real etcd v3 cluster.

It speaks etcd's gRPC API through the stubs that ``aetcd`` generates (``aetcd.rpc``), and
not through ``aetcd.Client``'s convenience layer, because the store needs what that layer
hides: compares over key ranges, failure branches that read, one bidirectional stream per
watch with its own start revision (or many watches on one stream:
:mod:`segtxn.metastore.etcd_watch`), and every gRPC status mapped to the store's own errors.

A URL names one or more endpoints and an optional namespace:
``etcd://10.0.0.1:2379,10.0.0.2:2379/segtxn``. Every physical key is prefixed with the
namespace, so several segtxn clusters (or test cases) can share one etcd cluster. When an
endpoint stops answering, the next request goes to the next endpoint.

With :class:`~segtxn.metastore.settings.StoreCredentials` the channel is TLS (etcd's
certificate checked against the CA, a client certificate presented to an etcd with
``--client-cert-auth``; the endpoint's host must be in the certificate), and with a user the
engine authenticates (etcd's ``Auth.Authenticate``) and sends the token it gets as the
``token`` metadata of every call, as etcd's own clients do. etcd forgets a token after a
while unused (``--auth-token-ttl``) or on another member: a call it refuses for that is made
again once with a new token. Wrong credentials and missing permissions are
:class:`StoreAccessDenied`, not retried. Credentials files that change are loaded again
(:mod:`.etcd_credentials`).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import grpc
from aetcd import rpc

from segtxn.metastore.engine import (
    Compare,
    DeleteOp,
    Engine,
    GetOp,
    KeyValue,
    ModEquals,
    PutOp,
    RangeResult,
    RawEvent,
    TxnOp,
    TxnResult,
    WatchMux,
    WatchMuxStream,
    WatchStream,
)
from segtxn.metastore.errors import (
    InvalidArgument,
    MetadataStoreError,
    SessionExpired,
    StoreAccessDenied,
    StoreClosed,
    StoreUnavailable,
)
from segtxn.metastore.etcd_credentials import LiveCredentials
from segtxn.metastore.etcd_errors import (
    authentication_off,
    map_grpc_error,
    map_watch_cancel,
    refused,
    token_gone,
)
from segtxn.metastore.etcd_watch import EtcdWatchMux, confirmed_watch
from segtxn.metastore.keys import prefix_end
from segtxn.metastore.settings import StoreCredentials

log = logging.getLogger(__name__)


class EtcdEngine(Engine):
    """Engine on an etcd v3 cluster (3.4 or newer)."""

    def __init__(
        self,
        endpoints: Sequence[str],
        namespace: bytes = b"",
        *,
        request_timeout_s: float = 5.0,
        max_message_bytes: int = 8 * 1024 * 1024,
        credentials: StoreCredentials | None = None,
    ) -> None:
        """Raises InvalidArgument: no endpoint, or credentials that cannot be used (files
        unreadable, a user without a password)."""
        if not endpoints:
            raise InvalidArgument("an etcd URL needs at least one host:port")
        credentials = credentials or StoreCredentials()
        self._credentials = LiveCredentials(credentials)
        self._user = credentials.user
        self._token: str | None = None
        """None: authenticate before the next call; "": etcd's authentication is off."""
        self._unused_user_said = False
        self._authenticating = asyncio.Lock()
        self._endpoints = list(endpoints)
        self._where = f"{','.join(self._endpoints)}{namespace.decode(errors='replace')}"
        """The store, for log lines."""
        self._current = 0
        self._ns = namespace
        self._timeout = request_timeout_s
        self._options = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            # A half-open connection must fail a watch instead of stalling it forever.
            # etcd refuses pings more often than every 5 s (--grpc-keepalive-min-time).
            ("grpc.keepalive_time_ms", 10_000),
            ("grpc.keepalive_timeout_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 1),
        ]
        self._channel: grpc.aio.Channel | None = None
        self._retired: list[grpc.aio.Channel] = []
        """Channels of TLS files since reloaded (one per reload), closed at close()."""
        self._made_with = 0
        """The TLS files (their ``tls_reloads``) the channel was made with."""
        self._kv: Any = None
        self._watch_stub: Any = None
        self._lease: Any = None
        self._maintenance: Any = None
        self._cluster: Any = None
        self._closed = False
        self._calls: set[Any] = set()

    # -- connection --------------------------------------------------------------------

    def _connect(self) -> None:
        """A channel for the next call. New credentials files (:mod:`.etcd_credentials`)
        get a new channel: the old one is retired, not closed (calls and watches on it go
        on; they end with it at :meth:`close`), so that a reload breaks nothing."""
        if self._closed:
            raise StoreClosed("the etcd store is closed")
        self._credentials.check()
        if self._channel is not None and self._made_with != self._credentials.tls_reloads:
            self._retired.append(self._channel)
            self._channel = None
        if self._channel is None:
            target, tls = self._endpoints[self._current], self._credentials.tls
            self._made_with = self._credentials.tls_reloads
            self._channel = (
                grpc.aio.insecure_channel(target, options=self._options)
                if tls is None
                else grpc.aio.secure_channel(target, tls, options=self._options)
            )
            self._token = None  # etcd's simple tokens are one member's
            self._kv = rpc.KVStub(self._channel)
            self._watch_stub = rpc.WatchStub(self._channel)
            self._lease = rpc.LeaseStub(self._channel)
            self._maintenance = rpc.MaintenanceStub(self._channel)
            self._cluster = rpc.ClusterStub(self._channel)

    async def _failover(self, error: grpc.aio.AioRpcError) -> None:
        """After UNAVAILABLE, move to the next endpoint (when there is more than one)."""
        if error.code() != grpc.StatusCode.UNAVAILABLE or len(self._endpoints) < 2:
            return
        channel, self._channel = self._channel, None
        self._current = (self._current + 1) % len(self._endpoints)
        self._token = None
        if channel is not None:
            await channel.close()

    async def _metadata(self) -> tuple[tuple[str, str], ...] | None:
        """A call's ``token`` metadata (None without a user, or with etcd's authentication off),
        got first when there is none yet. Raises StoreAccessDenied / StoreUnavailable."""
        if self._user is None:
            return None
        async with self._authenticating:
            if self._token is None:
                self._token = await self._authenticate(self._user)
            return (("token", self._token),) if self._token else None

    async def _authenticate(self, user: str) -> str:
        """A new token, or "" when etcd's authentication is off: etcd's clients go on without
        one (``etcdctl --user`` works there), and so does the engine, saying so once (it was
        taken for an outage, retried for ever). A call refused without a token (turned on
        since) forgets the "" (:meth:`_refused`): the next one authenticates."""
        self._connect()
        request = rpc.AuthenticateRequest(name=user, password=self._credentials.password)
        try:
            response = await rpc.AuthStub(self._channel).Authenticate(
                request, timeout=self._timeout
            )
        except grpc.aio.AioRpcError as e:
            if not authentication_off(e):
                raise await self._failed(e) from e
            if not self._unused_user_said:
                log.warning(
                    "metadata store %s: %s: user %r and its password are not used; calls go "
                    "without a token until etcd turns authentication on",
                    self._where,
                    e.details(),
                    user,
                )
                self._unused_user_said = True
            return ""
        self._unused_user_said = False
        return str(response.token)

    async def _failed(self, e: grpc.aio.AioRpcError) -> MetadataStoreError:
        """``e`` as the store's error, after forgetting a refused token (the next call
        authenticates again) and moving to the next endpoint if this one is down. A
        refusal of the credentials is remembered (:attr:`denied`) and logged once per
        cause."""
        if token_gone(e):
            self._token = None
        await self._failover(e)
        return self._refused(map_grpc_error(e))

    def _watch_cancelled(self, reason: str) -> MetadataStoreError:
        """etcd's reason for cancelling a watch as the store's error; a refusal is
        remembered and logged as :meth:`_failed` does (a watch etcd refuses for permission
        is the same refusal as a read of its range)."""
        return self._refused(map_watch_cancel(reason))

    def _refused(self, error: MetadataStoreError) -> MetadataStoreError:
        """``error``, after remembering it in :attr:`denied` (logged once per cause) if it
        is a refusal of the credentials or permissions. A call made without a token,
        authentication being off, refused: etcd turned it on, the next call authenticates."""
        if isinstance(error, StoreAccessDenied) and self._token == "":
            self._token = None
            return StoreUnavailable(f"etcd refused a call without a token ({error}): now with one")
        if isinstance(error, StoreAccessDenied):
            if self.denied is None or str(self.denied) != str(error):
                log.error(
                    "metadata store %s: access denied: %s. Every call that needs it fails "
                    "with StoreAccessDenied, and this server says it is not ready, until the "
                    "user's roles or password are set right again",
                    self._where,
                    error,
                )
            self.denied = error
        return error

    def _granted(self) -> None:
        """A call went through: access is back if it was denied."""
        if self.denied is not None:
            log.warning("metadata store %s: access granted again", self._where)
            self.denied = None

    async def _unary(self, method: str, request: Any, timeout_s: float | None = None) -> Any:
        try:
            response = await self._call(method, request, timeout_s)
        except grpc.aio.AioRpcError as e:
            if not (token_gone(e) or (self._token == "" and refused(e))):
                raise await self._failed(e) from e
            self._token = None  # a token etcd forgot, or now wants: once more with a new one
            try:
                response = await self._call(method, request, timeout_s)
            except grpc.aio.AioRpcError as e2:
                raise await self._failed(e2) from e2
        self._granted()
        return response

    async def _call(self, method: str, request: Any, timeout_s: float | None) -> Any:
        self._connect()
        metadata = await self._metadata()
        if method.startswith("Lease"):
            stub = self._lease
        elif method in ("Status", "Defragment"):
            stub = self._maintenance
        elif method == "MemberList":
            stub = self._cluster
        else:
            stub = self._kv
        timeout = self._timeout if timeout_s is None else timeout_s
        return await getattr(stub, method)(request, timeout=timeout, metadata=metadata)

    # -- key translation ---------------------------------------------------------------

    def _key(self, key: bytes) -> bytes:
        return self._ns + key

    def _kv_out(self, kv: Any) -> KeyValue:
        return KeyValue(
            kv.key[len(self._ns) :], kv.value, kv.create_revision, kv.mod_revision, kv.lease
        )

    # -- reads -------------------------------------------------------------------------

    async def range(self, lo: bytes, hi: bytes | None = None, *, limit: int = 0) -> RangeResult:
        request = rpc.RangeRequest(key=self._key(lo), limit=limit)
        if hi is not None:
            request.range_end = self._key(hi)
        response = await self._unary("Range", request)
        return RangeResult(
            [self._kv_out(kv) for kv in response.kvs], response.header.revision, response.more
        )

    async def current_revision(self) -> int:
        response = await self._unary(
            "Range", rpc.RangeRequest(key=self._key(b"\x00"), count_only=True)
        )
        return int(response.header.revision)

    # -- writes ------------------------------------------------------------------------

    async def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[TxnOp],
        failure: Sequence[TxnOp] = (),
    ) -> TxnResult:
        request = rpc.TxnRequest(
            compare=[self._compare(c) for c in compares],
            success=[self._op(op) for op in success],
            failure=[self._op(op) for op in failure],
        )
        response = await self._unary("Txn", request)
        ops = success if response.succeeded else failure
        results: list[KeyValue | int | None] = []
        for op, item in zip(ops, response.responses, strict=True):
            if isinstance(op, GetOp):
                kvs = item.response_range.kvs
                results.append(self._kv_out(kvs[0]) if kvs else None)
            elif isinstance(op, DeleteOp):
                results.append(int(item.response_delete_range.deleted))
            else:
                results.append(None)
        return TxnResult(bool(response.succeeded), int(response.header.revision), results)

    def _compare(self, compare: Compare) -> Any:
        if isinstance(compare, ModEquals):
            return rpc.Compare(
                key=self._key(compare.key),
                target=rpc.Compare.MOD,
                result=rpc.Compare.EQUAL,
                mod_revision=compare.revision,
            )
        return rpc.Compare(
            key=self._key(compare.lo),
            range_end=self._key(compare.hi),
            target=rpc.Compare.MOD,
            result=rpc.Compare.LESS,
            mod_revision=compare.revision + 1,
        )

    def _op(self, op: TxnOp) -> Any:
        if isinstance(op, PutOp):
            return rpc.RequestOp(
                request_put=rpc.PutRequest(key=self._key(op.key), value=op.value, lease=op.lease)
            )
        if isinstance(op, DeleteOp):
            request = rpc.DeleteRangeRequest(key=self._key(op.key))
            if op.range_end is not None:
                request.range_end = self._key(op.range_end)
            return rpc.RequestOp(request_delete_range=request)
        return rpc.RequestOp(request_range=rpc.RangeRequest(key=self._key(op.key)))

    # -- watches -----------------------------------------------------------------------

    def watch(self, lo: bytes, hi: bytes | None, start_revision: int) -> WatchStream:
        return self._watch(lo, hi, start_revision)

    @asynccontextmanager
    async def _watch(
        self, lo: bytes, hi: bytes | None, start_revision: int
    ) -> AsyncIterator[AsyncIterator[Sequence[RawEvent]]]:
        self._connect()
        create = rpc.WatchCreateRequest(key=self._key(lo), start_revision=start_revision)
        if hi is not None:
            create.range_end = self._key(hi)
        call = self._watch_stub.Watch(metadata=await self._metadata())
        self._calls.add(call)
        try:
            async with confirmed_watch(
                call,
                create,
                namespace=self._ns,
                timeout_s=self._timeout,
                failed=self._failed,
                cancelled=self._watch_cancelled,
                closed=lambda: self._closed,
            ) as batches:
                yield batches
        finally:
            self._calls.discard(call)
            await _finish(call)

    def watch_many(self) -> WatchMuxStream:
        return self._watch_many()

    @asynccontextmanager
    async def _watch_many(self) -> AsyncIterator[WatchMux]:
        """One ``Watch`` call for many watches (see :mod:`segtxn.metastore.etcd_watch`)."""
        self._connect()
        call = self._watch_stub.Watch(metadata=await self._metadata())
        self._calls.add(call)
        try:
            yield EtcdWatchMux(
                call, self._ns, self._failed, self._watch_cancelled, lambda: self._closed
            )
        finally:
            self._calls.discard(call)
            await _finish(call)

    # -- leases ------------------------------------------------------------------------

    async def lease_grant(self, ttl_s: float) -> tuple[int, float]:
        ttl = max(1, math.ceil(ttl_s))
        response = await self._unary("LeaseGrant", rpc.LeaseGrantRequest(TTL=ttl))
        if response.error:
            raise StoreUnavailable(f"etcd refused a lease: {response.error}")
        return int(response.ID), float(response.TTL)

    async def lease_keepalive(self, lease_id: int) -> float:
        self._connect()
        metadata = await self._metadata()
        call = self._lease.LeaseKeepAlive(timeout=self._timeout, metadata=metadata)
        try:
            await call.write(rpc.LeaseKeepAliveRequest(ID=lease_id))
            response = await call.read()
        except grpc.aio.AioRpcError as e:
            raise await self._failed(e) from e
        finally:
            await _finish(call)
        if response is grpc.aio.EOF:
            raise StoreUnavailable("etcd ended the keep-alive stream")
        return float(max(0, response.TTL))

    async def lease_revoke(self, lease_id: int) -> None:
        try:
            await self._unary("LeaseRevoke", rpc.LeaseRevokeRequest(ID=lease_id))
        except SessionExpired:
            return

    # -- maintenance -------------------------------------------------------------------

    async def compact(self, revision: int) -> None:
        self._connect()
        metadata = await self._metadata()
        try:
            await self._kv.Compact(
                rpc.CompactionRequest(revision=revision, physical=True),
                timeout=self._timeout,
                metadata=metadata,
            )
        except grpc.aio.AioRpcError as e:
            if "compacted" in (e.details() or ""):
                return  # already compacted at or past `revision`
            raise await self._failed(e) from e

    async def member_status(self) -> Any:
        """etcd's ``StatusResponse`` of the member this engine talks to now (its
        ``dbSize``, ``dbSizeInUse``, ``leader``, ``header.member_id``...)."""
        return await self._unary("Status", rpc.StatusRequest())

    async def member_list(self) -> Any:
        """etcd's ``MemberListResponse``: every member, with its ``clientURLs``."""
        return await self._unary("MemberList", rpc.MemberListRequest())

    async def defragment(self, timeout_s: float) -> None:
        """Defragment the member this engine talks to (it answers nothing else meanwhile);
        ``timeout_s``: how long it may take (a large database takes seconds)."""
        await self._unary("Defragment", rpc.DefragmentRequest(), timeout_s)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for call in list(self._calls):
            call.cancel()
        for channel in [*self._retired, *([self._channel] if self._channel else [])]:
            await channel.close()
        self._retired.clear()
        self._channel = None


async def _finish(call: Any) -> None:
    """Cancel a streaming call and wait until gRPC has torn it down (its internal tasks
    would otherwise outlive the caller)."""
    call.cancel()
    try:
        await call.code()
    except asyncio.CancelledError:
        raise
    except Exception:
        return


def parse_endpoints(netloc: str) -> list[str]:
    """``host:port[,host:port...]`` -> a list of gRPC targets (default port 2379)."""
    out = []
    for item in netloc.split(","):
        endpoint = item.strip()
        if endpoint:
            has_port = ":" in endpoint.rsplit("]", 1)[-1]
            out.append(endpoint if has_port else f"{endpoint}:2379")
    return out


def namespace_bytes(path: str) -> bytes:
    """The URL path (``/segtxn``) as a key prefix; ``""`` or ``/`` means no namespace."""
    path = path.rstrip("/")
    if not path:
        return b""
    raw = path.encode()
    prefix_end(raw)  # validates
    return raw
