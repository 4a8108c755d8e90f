"""The ``etcd://`` backend's connection: how the engine (:mod:`segtxn.metastore.etcd`)
reaches etcd, not what it asks.

One :class:`EtcdConnection` holds the gRPC channel and its stubs, moves to the next
endpoint when one stops answering, and keeps the authentication token and the refusal of
the credentials (``denied``) that every call shares.

With :class:`~segtxn.metastore.settings.StoreCredentials` the channel is TLS (etcd's
certificate checked against the CA, a client certificate presented to an etcd with
``--client-cert-auth``; the endpoint's host must be in the certificate), and with a user the
connection authenticates (etcd's ``Auth.Authenticate``) and sends the token it gets as the
``token`` metadata of every call, as etcd's own clients do. etcd forgets a token after a
while unused (``--auth-token-ttl``) or on another member: a call it refuses for that is made
again once with a new token. Wrong credentials and missing permissions are
:class:`StoreAccessDenied`, not retried. Credentials files that change are loaded again
(:mod:`.etcd_credentials`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from aetcd import rpc

from segtxn.metastore.errors import (
    InvalidArgument,
    MetadataStoreError,
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
from segtxn.metastore.settings import StoreCredentials

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Stubs:
    """etcd's gRPC services on the current channel."""

    kv: Any
    watch: Any
    lease: Any
    maintenance: Any
    cluster: Any


class EtcdConnection:
    """The channel, endpoint, token and refusal state of one etcd engine.

    Contract: :meth:`stubs` gives the stubs of a live channel (or raises StoreClosed after
    :meth:`close`); a caller of a streaming call sends :meth:`metadata` with it and turns
    its failures into the store's errors with :meth:`failed`, which also forgets a token
    etcd refused and fails over to the next endpoint. :meth:`unary` does all of that for
    one request and answer, and makes a call refused for its token once more with a new
    token.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        where: str,
        *,
        request_timeout_s: float,
        max_message_bytes: int,
        credentials: StoreCredentials,
    ) -> None:
        """``where``: the store, for log lines.

        Raises InvalidArgument: no endpoint, or credentials that cannot be used (files
        unreadable, a user without a password)."""
        if not endpoints:
            raise InvalidArgument("an etcd URL needs at least one host:port")
        self._credentials = LiveCredentials(credentials)
        self._user = credentials.user
        self._token: str | None = None
        """None: authenticate before the next call; "": etcd's authentication is off."""
        self._unused_user_said = False
        self._authenticating = asyncio.Lock()
        self._endpoints = list(endpoints)
        self._where = where
        self._current = 0
        self.timeout_s = request_timeout_s
        """How long one request may take."""
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
        self._stubs: Stubs | None = None
        self._retired: list[grpc.aio.Channel] = []
        """Channels of TLS files since reloaded (one per reload), closed at close()."""
        self._made_with = 0
        """The TLS files (their ``tls_reloads``) the channel was made with."""
        self.closed = False
        self.denied: StoreAccessDenied | None = None
        """See :attr:`segtxn.metastore.engine.Engine.denied`."""

    def stubs(self) -> Stubs:
        """The stubs of a channel for the next call. New credentials files
        (:mod:`.etcd_credentials`) get a new channel: the old one is retired, not closed
        (calls and watches on it go on; they end with it at :meth:`close`), so that a
        reload breaks nothing.

        Raises StoreClosed after :meth:`close`; InvalidArgument for credentials files
        that changed into unusable ones."""
        if self.closed:
            raise StoreClosed("the etcd store is closed")
        self._credentials.check()
        if self._channel is not None and self._made_with != self._credentials.tls_reloads:
            self._retired.append(self._channel)
            self._channel = self._stubs = None
        if self._stubs is None:
            target, tls = self._endpoints[self._current], self._credentials.tls
            self._made_with = self._credentials.tls_reloads
            self._channel = (
                grpc.aio.insecure_channel(target, options=self._options)
                if tls is None
                else grpc.aio.secure_channel(target, tls, options=self._options)
            )
            self._token = None  # etcd's simple tokens are one member's
            self._stubs = Stubs(
                kv=rpc.KVStub(self._channel),
                watch=rpc.WatchStub(self._channel),
                lease=rpc.LeaseStub(self._channel),
                maintenance=rpc.MaintenanceStub(self._channel),
                cluster=rpc.ClusterStub(self._channel),
            )
        return self._stubs

    async def _failover(self, error: grpc.aio.AioRpcError) -> None:
        """After UNAVAILABLE, move to the next endpoint (when there is more than one)."""
        if error.code() != grpc.StatusCode.UNAVAILABLE or len(self._endpoints) < 2:
            return
        channel, self._channel, self._stubs = self._channel, None, None
        self._current = (self._current + 1) % len(self._endpoints)
        self._token = None
        if channel is not None:
            await channel.close()

    async def metadata(self) -> tuple[tuple[str, str], ...] | None:
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
        self.stubs()
        request = rpc.AuthenticateRequest(name=user, password=self._credentials.password)
        try:
            response = await rpc.AuthStub(self._channel).Authenticate(
                request, timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as e:
            if not authentication_off(e):
                raise await self.failed(e) from e
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

    async def failed(self, e: grpc.aio.AioRpcError) -> MetadataStoreError:
        """``e`` as the store's error, after forgetting a refused token (the next call
        authenticates again) and moving to the next endpoint if this one is down. A
        refusal of the credentials is remembered (:attr:`denied`) and logged once per
        cause."""
        if token_gone(e):
            self._token = None
        await self._failover(e)
        return self._refused(map_grpc_error(e))

    def watch_cancelled(self, reason: str) -> MetadataStoreError:
        """etcd's reason for cancelling a watch as the store's error; a refusal is
        remembered and logged as :meth:`failed` does (a watch etcd refuses for permission
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

    async def unary(self, method: str, request: Any, timeout_s: float | None = None) -> Any:
        """Call ``method`` (a unary RPC of the KV, Lease, Maintenance or Cluster service)
        with ``request``; ``timeout_s`` defaults to :attr:`timeout_s`.

        Raises the store's errors (:meth:`failed`)."""
        try:
            response = await self._call(method, request, timeout_s)
        except grpc.aio.AioRpcError as e:
            if not (token_gone(e) or (self._token == "" and refused(e))):
                raise await self.failed(e) from e
            self._token = None  # a token etcd forgot, or now wants: once more with a new one
            try:
                response = await self._call(method, request, timeout_s)
            except grpc.aio.AioRpcError as e2:
                raise await self.failed(e2) from e2
        self._granted()
        return response

    async def _call(self, method: str, request: Any, timeout_s: float | None) -> Any:
        stubs = self.stubs()
        metadata = await self.metadata()
        if method.startswith("Lease"):
            stub = stubs.lease
        elif method in ("Status", "Defragment"):
            stub = stubs.maintenance
        elif method == "MemberList":
            stub = stubs.cluster
        else:
            stub = stubs.kv
        timeout = self.timeout_s if timeout_s is None else timeout_s
        return await getattr(stub, method)(request, timeout=timeout, metadata=metadata)

    async def close(self) -> None:
        """Close every channel (calls still on them end); :meth:`stubs` refuses from now
        on. Idempotent."""
        self.closed = True
        for channel in [*self._retired, *([self._channel] if self._channel else [])]:
            await channel.close()
        self._retired.clear()
        self._channel = self._stubs = None
