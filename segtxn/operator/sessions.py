"""The operator's HTTP sessions to each cluster's brokers and coordinators.

A cluster with security off is reached with the operator's one plain session. A cluster
with security on needs its own: TLS verifying the servers against that cluster's CA, and
the admin role's token on every request (:data:`.security.ADMIN_ROLE`: ``admin`` on
``*``, what the operator's calls need: topics, splits and merges, brokers' homes and
drains, the coordinators' stats). Both come from the admin token's Secret, which
:mod:`.credentials` keeps (``token`` and ``ca.crt``; with cert-manager, until the CA is
copied there, from the brokers' certificate Secret that cert-manager writes); they are
read at each use and a session is made again when either changed (a renewed token, a new
CA). With ``spec.security.clientCertificates`` the Secret also holds the admin role's
client certificate (``tls.crt``, ``tls.key``), which the session presents.
"""

from __future__ import annotations

import base64
import os
import ssl
from collections.abc import Mapping
from typing import Any

import aiohttp
import kopf

from segtxn.operator import security, securitynames
from segtxn.operator.kube import Kube
from segtxn.protocol.auth import bearer_middleware

WAIT_S = 5.0
"""Retry delay while a cluster's admin token or CA is not there yet."""


def secret_text(secret: Mapping[str, Any] | None, key: str) -> str | None:
    """A Secret's ``data[key]`` decoded, or None when absent."""
    value = ((secret or {}).get("data") or {}).get(key)
    return base64.b64decode(value).decode() if value else None


def _load_client_certificate(context: ssl.SSLContext, cert: str, key: str) -> None:
    """Put a client certificate and its key (PEM text) into ``context``. ``ssl`` loads
    them from files only, and the operator's root filesystem is read-only: they pass
    through anonymous in-memory files (``memfd``), never a disk.

    Raises:
        ssl.SSLError: they do not load (not PEM, a key of another certificate).
    """
    fds = [os.memfd_create("segtxn-client-cert", os.MFD_CLOEXEC) for _ in range(2)]
    try:
        for fd, text in zip(fds, (cert, key), strict=True):
            data = memoryview(text.encode())
            while data:
                data = data[os.write(fd, data) :]
        context.load_cert_chain(f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}")
    finally:
        for fd in fds:
            os.close(fd)


class ClusterSessions:
    """One session per secured cluster, kept while its token and CA stay the same."""

    def __init__(self) -> None:
        self._sessions: dict[tuple[str, str], tuple[tuple[str | None, ...], aiohttp.ClientSession]]
        self._sessions = {}
        self._retired: list[aiohttp.ClientSession] = []
        """Sessions of a token or CA since replaced: a handler may still be using one, so
        they are closed with the rest (one per renewal: a handful a year)."""

    async def session(
        self,
        kube: Kube,
        plain: aiohttp.ClientSession,
        namespace: str,
        cluster: str,
        spec: Mapping[str, Any],
    ) -> aiohttp.ClientSession:
        """The session for calls to SegtxnCluster ``cluster`` (``spec``, its spec):
        ``plain`` when its security is off.

        Raises:
            kopf.TemporaryError: security is on and its admin token Secret (with the CA)
                is not there yet.
            KubeError: reading the Secret failed.
        """
        if not security.enabled(spec):
            return plain
        name = securitynames.token_secret(cluster, security.ADMIN_ROLE)
        found = await kube.get("v1", "Secret", namespace, name)
        token, ca = secret_text(found, "token"), secret_text(found, "ca.crt")
        pair = (secret_text(found, "tls.crt"), secret_text(found, "tls.key"))
        if token is not None and ca is None:  # cert-manager's CA, not copied over yet
            brokers = securitynames.broker_tls_secret(cluster)
            ca = secret_text(await kube.get("v1", "Secret", namespace, brokers), "ca.crt")
        if token is None or ca is None:
            raise kopf.TemporaryError(
                f"waiting for Secret {name} (the admin token and the cluster's CA)", delay=WAIT_S
            )
        key = (namespace, cluster)
        kept = self._sessions.get(key)
        if kept is not None and kept[0] == (token, ca, *pair):
            return kept[1]
        try:
            context = ssl.create_default_context(cadata=ca)
            if pair[0] is not None and pair[1] is not None:
                _load_client_certificate(context, pair[0], pair[1])
        except ssl.SSLError as e:
            raise kopf.TemporaryError(
                f"Secret {name}: ca.crt, tls.crt or tls.key does not load ({e})", delay=WAIT_S
            ) from e
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context), middlewares=(bearer_middleware(token),)
        )
        self._sessions[key] = ((token, ca, *pair), session)
        if kept is not None:
            self._retired.append(kept[1])
        return session

    async def close(self) -> None:
        for session in [*(s for _, s in self._sessions.values()), *self._retired]:
            await session.close()
        self._sessions.clear()
        self._retired.clear()
