"""The Secrets a secured SegtxnCluster runs on, created once, reused, renewed before they
expire.

For a cluster with ``spec.security.enabled`` (:mod:`.security` says what each Secret
holds and who mounts it) the cluster's handler calls :func:`ensure_cluster` before it
applies the workloads that mount them, and a TransactionCoordinator's handler
:func:`ensure_coordinator`; a timer (:func:`renew`) calls the first again every
:data:`RENEW_CHECK_S`, so what is due is renewed while nothing else happens.

Each Secret is read first and kept when it is still good: it loads, it was made with the
current CA or signing key, its names are the ones wanted, and it does not expire within
``renewBeforeDays``. Only otherwise is a new one made and applied (server-side apply, owned
by the cluster, or by its TransactionCoordinator for the coordinators' certificate). So a
reconcile repeated, or an operator restarted, changes nothing; a Secret deleted by hand is
made again. The servers reload a renewed certificate by themselves (the kubelet updates
the mounted files; segtxn/auth/tls.py watches them). The cluster token and the token
key's public half are read by the servers at start-up only, so the cluster token lives
:data:`CLUSTER_TOKEN_DAYS` and the key is never rotated unless its Secret is deleted
(docs/security.md, "On Kubernetes").

With ``certificates: cert-manager`` the certificates are cert-manager's (the operator
applies its Certificates and Issuers, :func:`.certmanager.cert_manager_objects`); the tokens
are still the operator's, and their Secrets get the CA from the brokers' Secret once
cert-manager has written it.
"""

from __future__ import annotations

import base64
import datetime
import logging
from collections.abc import Mapping, Sequence
from typing import Any, cast

import kopf

from segtxn.operator import certmanager, pki, render, security, securitynames
from segtxn.operator.runtime import (
    API,
    GROUP,
    RETRY_S,
    VERSION,
    Runtime,
    apply_objects,
    runtime_of,
    serving,
    snapshot,
    track,
)
from segtxn.operator.security import CertificateSource, SecuritySpec
from segtxn.operator.sessions import secret_text

log = logging.getLogger(__name__)

RENEW_CHECK_S = 300.0
"""How often every secured cluster's Secrets are checked (a few GETs each): renewals,
and cert-manager's CA copied into the token Secrets once it has written it."""
CLUSTER_TOKEN_DAYS = 3650
"""The cluster role's token: servers read it at start-up only, so it must outlive them."""

Obj = dict[str, Any]


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _secret(
    name: str, namespace: str, cluster: str, data: Mapping[str, bytes | str], kind: str = "Opaque"
) -> Obj:
    encoded = {
        k: base64.b64encode(v if isinstance(v, bytes) else v.encode()).decode()
        for k, v in data.items()
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": render.labels(cluster, "security"),
        },
        "type": kind,
        "data": encoded,
    }


def _bytes(secret: Mapping[str, Any] | None, key: str) -> bytes | None:
    text = secret_text(secret, key)
    return None if text is None else text.encode()


def _due(expires: datetime.datetime | None, now: datetime.datetime, sec: SecuritySpec) -> bool:
    return expires is None or expires - datetime.timedelta(days=sec.renew_before_days) <= now


class _Ensure:
    """One pass over a cluster's Secrets: reads, and the applies of what must be new."""

    def __init__(
        self,
        runtime: Runtime,
        namespace: str,
        cluster: str,
        sec: SecuritySpec,
        now: datetime.datetime,
    ) -> None:
        self.runtime, self.namespace, self.cluster = runtime, namespace, cluster
        self.sec, self.now = sec, now

    async def get(self, name: str) -> Obj | None:
        return await self.runtime.kube.get("v1", "Secret", self.namespace, name)

    async def put(
        self,
        owner: kopf.Body,
        name: str,
        data: Mapping[str, bytes | str],
        kind: str = "Opaque",
        why: str = "",
    ) -> None:
        await apply_objects(
            self.runtime, owner, [_secret(name, self.namespace, self.cluster, data, kind)]
        )
        log.info("%s/%s: Secret %s written (%s)", self.namespace, self.cluster, name, why)
        kopf.info(owner, reason="SecretIssued", message=f"Secret {name}: {why}")

    async def ca(self, owner: kopf.Body) -> pki.Issued:
        """The cluster CA: kept while it loads and is not due; else a new one (every
        certificate it signed is then issued again: :meth:`server`)."""
        name = securitynames.ca_secret(self.cluster)
        found = await self.get(name)
        cert, key = _bytes(found, "tls.crt"), _bytes(found, "tls.key")
        why = "created"
        if cert is not None and key is not None:
            try:
                if not _due(pki.expires(cert), self.now, self.sec):
                    return pki.Issued(cert, key)
                why = "renewed before it expires"
            except pki.PkiError as e:
                why = f"replaced: {e}"
        ca = pki.new_ca(f"{self.cluster} segtxn cluster CA", self.now)
        data = {"tls.crt": ca.cert_pem, "tls.key": ca.key_pem, "ca.crt": ca.cert_pem}
        await self.put(owner, name, data, "kubernetes.io/tls", why)
        return ca

    async def server(
        self, owner: kopf.Body, name: str, ca: pki.Issued, dns_names: list[str]
    ) -> None:
        """A server certificate Secret, kept while it is signed by ``ca``, for exactly
        ``dns_names``, with ``ca`` as its ``ca.crt``, and not due."""
        found = await self.get(name)
        cert = _bytes(found, "tls.crt")
        why = "created"
        if cert is not None and _bytes(found, "tls.key") is not None:
            try:
                if not pki.signed_by(cert, ca.cert_pem) or _bytes(found, "ca.crt") != ca.cert_pem:
                    why = "issued by the current CA"
                elif sorted(pki.dns_names_of(cert)) != sorted(dns_names):
                    why = "for the names wanted now"
                elif _due(pki.expires(cert), self.now, self.sec):
                    why = "renewed before it expires"
                else:
                    return
            except pki.PkiError as e:
                why = f"replaced: {e}"
        issued = pki.issue_server(ca, dns_names[0], dns_names, self.now, self.sec.certificate_days)
        data = {"tls.crt": issued.cert_pem, "tls.key": issued.key_pem, "ca.crt": ca.cert_pem}
        await self.put(owner, name, data, "kubernetes.io/tls", why)

    async def signer(self, owner: kopf.Body) -> bytes:
        """The token signing key; a new one only when there is none that loads."""
        name = securitynames.signer_secret(self.cluster)
        key = _bytes(await self.get(name), "private.pem")
        if key is not None:
            try:
                pki.public_key_pem(key)
                return key
            except pki.PkiError as e:
                log.warning("Secret %s: %s; making a new signing key", name, e)
        key = pki.new_signing_key()
        await self.put(owner, name, {"private.pem": key}, why="created")
        return key

    def _token_good(self, token: bytes | None, key: bytes) -> bool:
        if token is None or not pki.token_verifies(token.decode(), key):
            return False
        return not _due(pki.token_expires(token.decode()), self.now, self.sec)

    async def auth(self, owner: kopf.Body, key: bytes) -> None:
        """What the servers mount: the key's public half and the cluster role's token."""
        name = securitynames.auth_secret(self.cluster)
        found = await self.get(name)
        public = pki.public_key_pem(key)
        if _bytes(found, "public.pem") == public and self._token_good(
            _bytes(found, "cluster.jwt"), key
        ):
            return
        token = pki.mint_token(key, security.CLUSTER_ROLE, self.now, CLUSTER_TOKEN_DAYS)
        await self.put(
            owner,
            name,
            {"public.pem": public, "cluster.jwt": token},
            why="the cluster role's token",
        )

    def _client_good(self, cert: bytes | None, ca: pki.Issued, role: str) -> bool:
        try:
            return (
                cert is not None
                and pki.signed_by(cert, ca.cert_pem)
                and pki.common_name_of(cert) == role
                and not _due(pki.expires(cert), self.now, self.sec)
            )
        except pki.PkiError:
            return False

    async def token(
        self,
        owner: kopf.Body,
        role: str,
        key: bytes,
        ca: bytes | None,
        client_ca: pki.Issued | None = None,
    ) -> None:
        """A role's token Secret (``token``, ``ca.crt`` once the CA is known), and with
        ``client_ca`` (``clientCertificates``) a client certificate for the role
        (``tls.crt``, ``tls.key``). What is still good is kept; the Secret is written only
        when something in it must change (a key no longer wanted goes with the write)."""
        name = securitynames.token_secret(self.cluster, role)
        found = await self.get(name)
        token = _bytes(found, "token")
        data: dict[str, bytes] = {
            "token": token
            if token is not None and self._token_good(token, key)
            else pki.mint_token(key, role, self.now, self.sec.token_days).encode()
        }
        if ca is not None:
            data["ca.crt"] = ca
        if client_ca is not None:
            cert, cert_key = _bytes(found, "tls.crt"), _bytes(found, "tls.key")
            if cert is None or cert_key is None or not self._client_good(cert, client_ca, role):
                issued = pki.issue_client(client_ca, role, self.now, self.sec.token_days)
                cert, cert_key = issued.cert_pem, issued.key_pem
            data["tls.crt"], data["tls.key"] = cert, cert_key
        present = set(((found or {}).get("data") or {}).keys())
        if present == set(data) and all(_bytes(found, k) == v for k, v in data.items()):
            return
        what = " and its client certificate" if client_ca is not None else ""
        await self.put(owner, name, dict(data), why=f"a token of role {role}{what}")


async def ensure_cluster(
    runtime: Runtime,
    owner: kopf.Body,
    spec: Mapping[str, Any],
    coordinators: Sequence[str] = (),
    now: datetime.datetime | None = None,
) -> None:
    """Make sure SegtxnCluster ``owner`` (``spec``, its spec) has every Secret its
    security needs (module docstring), and each of its ``coordinators``
    (TransactionCoordinator names) its certificate; nothing when security is off.

    Raises:
        security.InvalidSecurity: ``spec.security`` cannot run (checked first, before
            anything is written).
        kopf.TemporaryError, kopf.PermanentError: an apply failed (:func:`apply_objects`).
        KubeError: a read failed.
    """
    sec = SecuritySpec.of(spec)
    if not sec.enabled:
        return
    sec.policy()
    namespace, cluster = str(owner.meta.namespace), str(owner.meta.name)
    work = _Ensure(runtime, namespace, cluster, sec, now or _now())
    ca_pem: bytes | None
    client_ca: pki.Issued | None = None
    if sec.certificates is CertificateSource.CERT_MANAGER:
        labels = render.labels(cluster, "security")
        await apply_objects(
            runtime, owner, certmanager.cert_manager_objects(cluster, namespace, spec, labels)
        )
        ca_pem = _bytes(await work.get(securitynames.broker_tls_secret(cluster)), "ca.crt")
    else:
        ca = await work.ca(owner)
        names = securitynames.broker_dns_names(cluster, namespace)
        await work.server(owner, securitynames.broker_tls_secret(cluster), ca, names)
        ca_pem = ca.cert_pem
        client_ca = ca if sec.client_certificates else None
    key = await work.signer(owner)
    await work.auth(owner, key)
    for role in sec.token_roles():
        await work.token(owner, role, key, ca_pem, client_ca)
    # Kopf's index is live: a coordinator made or deleted during an await below would
    # change it under the loop (RuntimeError); one made meanwhile has its own handler.
    for name in sorted(coordinators):
        found = await runtime.kube.get(API, "TransactionCoordinator", namespace, name)
        if found is not None and not found.get("metadata", {}).get("deletionTimestamp"):
            tc = kopf.Body(cast(kopf.RawBody, found))
            await ensure_coordinator(runtime, tc, cluster, spec, now)


async def ensure_coordinator(
    runtime: Runtime,
    owner: kopf.Body,
    cluster: str,
    cluster_spec: Mapping[str, Any],
    now: datetime.datetime | None = None,
) -> None:
    """Make sure TransactionCoordinator ``owner`` has its coordinators' certificate
    (owned by it), issued by its cluster's CA; nothing when the cluster's security is off.

    Raises:
        kopf.TemporaryError: the cluster's CA is not there yet (its handler makes it).
        kopf.PermanentError: an apply was refused.
        KubeError: a read failed.
    """
    sec = SecuritySpec.of(cluster_spec)
    if not sec.enabled:
        return
    namespace, name = str(owner.meta.namespace), str(owner.meta.name)
    if sec.certificates is CertificateSource.CERT_MANAGER:
        labels = render.labels(name, "security")
        objects = certmanager.coordinator_certificate(
            name, namespace, cluster, cluster_spec, labels
        )
        await apply_objects(runtime, owner, objects)
        return
    work = _Ensure(runtime, namespace, cluster, sec, now or _now())
    found = await work.get(securitynames.ca_secret(cluster))
    cert, key = _bytes(found, "tls.crt"), _bytes(found, "tls.key")
    if cert is None or key is None:
        raise kopf.TemporaryError(
            f"waiting for SegtxnCluster {cluster}'s CA (Secret {securitynames.ca_secret(cluster)})",
            delay=RETRY_S,
        )
    names = securitynames.coordinator_dns_names(name, namespace)
    await work.server(
        owner, securitynames.coordinator_tls_secret(name), pki.Issued(cert, key), names
    )


@kopf.timer(
    GROUP,
    VERSION,
    "segtxnclusters",
    interval=RENEW_CHECK_S,
    initial_delay=RENEW_CHECK_S,
    when=serving,
)
async def renew(
    *,
    body: kopf.Body,
    namespace: str | None,
    name: str,
    spec: kopf.Spec,
    memo: Any,
    **indexes: Any,
) -> None:
    """Every :data:`RENEW_CHECK_S`: what is due of a secured cluster's Secrets renewed
    (:func:`ensure_cluster`). A spec that cannot run is the handler's to say."""
    if track(memo, indexes["stopped"]):  # Kopf's TimerFn type leaves this kwarg out
        return
    body = snapshot(body)  # one spec for the whole renewal
    spec = body.spec
    if body.meta.get("deletionTimestamp") or not security.enabled(spec):
        return
    runtime = runtime_of(memo)
    coordinators = indexes["coordinators_by_cluster"].get((namespace, name), [])
    try:
        await ensure_cluster(runtime, body, spec, coordinators)
    except security.InvalidSecurity as e:
        log.warning("%s/%s: not renewing: %s", namespace, name, e)
