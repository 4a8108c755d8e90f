"""The few Kubernetes API calls the handlers make beyond what Kopf does for them.

Kopf patches the handled resource (status, finalizers) itself; this client applies the
children the renderers return (server-side apply: :meth:`Kube.apply`), reads other
objects, patches a resource's status while a long handler runs (:meth:`Kube.patch_status`:
a step of a resharding), and evicts a broker's pod, which is how the operator rolls the
brokers (:mod:`.rolling`; their StatefulSet is ``OnDelete``): an eviction, not a delete,
so that a PodDisruptionBudget is honoured. It deletes nothing.
It authenticates with whatever Kopf's login found (service account in a pod,
kubeconfig outside), so there is one source of credentials. A pod's service-account token
is bound and rotated: the kubelet rewrites the token file (about hourly) and the API server
refuses the old token once it expires. So on a 401 the client re-reads that file
(:data:`SERVICE_ACCOUNT_TOKEN`) and, when it holds another token, sends the request again
once with it, as Kopf's own client re-authenticates.

:data:`CALLS` lists every request this module sends, as RBAC sees them; the chart grants
those (and Kopf's own) and nothing else, which ``tests/operator/test_rbac.py`` checks.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import ssl
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import kopf

Obj = dict[str, Any]

SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
"""A pod's service-account token, where Kopf's in-cluster login reads it and the kubelet
rewrites it as it rotates."""

log = logging.getLogger(__name__)

PLURALS = {
    "ConfigMap": "configmaps",
    "Service": "services",
    "StatefulSet": "statefulsets",
    "Deployment": "deployments",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "SegtxnCluster": "segtxnclusters",
    "TransactionCoordinator": "transactioncoordinators",
    "ScalableTopic": "scalabletopics",
    "Pod": "pods",
    "VerificationRun": "verificationruns",
    "Secret": "secrets",
    "Certificate": "certificates",
    "Issuer": "issuers",
    "KopfPeering": "kopfpeerings",
    "ClusterKopfPeering": "clusterkopfpeerings",
}


FIELD_MANAGER = "segtxn-operator"
"""Who the operator is in ``metadata.managedFields`` of what it applies."""
APPLY_PATCH = "application/apply-patch+yaml"
"""Server-side apply's Content-Type (a JSON body is YAML too)."""
MERGE_PATCH = "application/merge-patch+json"


CHILD_KINDS = (
    "ConfigMap",
    "Service",
    "StatefulSet",
    "Deployment",
    "PodDisruptionBudget",
    "Pod",
    "Secret",
    "Certificate",
    "Issuer",
)
"""What the renderers return, and :meth:`Kube.apply` applies (a Pod: a VerificationRun's
driver, :mod:`.sparkapp`; the Secrets of a secured cluster and cert-manager's Certificates
and Issuers: :mod:`.credentials`)."""
READ_KINDS = (
    "SegtxnCluster",
    "TransactionCoordinator",
    "StatefulSet",
    "Deployment",
    "ConfigMap",
    "Pod",
    "Secret",
)
"""What the handlers read: a coordinator's cluster, the workloads (status, what was
applied), the ConfigMap the brokers run, a broker's pod in a roll, a VerificationRun's
driver pod and report ConfigMap, a secured cluster's Secrets (kept when still good,
:mod:`.credentials`; the admin token, :mod:`.sessions`)."""
PEERING_KINDS = ("KopfPeering", "ClusterKopfPeering")
"""Kopf's peering objects (group ``kopf.dev``), read once at start-up
(:mod:`.peering`): the namespaced one, or the cluster one when every namespace is
watched."""
CALLS: frozenset[tuple[str, str, str]] = frozenset(
    {
        *(("get", kind, "") for kind in READ_KINDS),
        *(("get", kind, "") for kind in PEERING_KINDS),
        *((verb, kind, "") for verb in ("create", "patch") for kind in CHILD_KINDS),
        ("patch", "ScalableTopic", "status"),
        ("patch", "VerificationRun", "status"),
        ("create", "Pod", "eviction"),
    }
)
"""(RBAC verb, kind, subresource) of every request :class:`Kube` may send: a GET of
:data:`READ_KINDS` and of a peering object (:data:`PEERING_KINDS`); a server-side apply
of a child (``patch``, and ``create`` when the child does not exist yet); a status patch
of a ScalableTopic or a VerificationRun (a step of a resharding, a run's phase); a pod's
eviction. Each
method refuses anything else (:class:`NotGranted`), so this list is what the code does
and the chart's RBAC can be checked against it."""


class KubeUnreachable(Exception):
    """The API server did not answer (the operator cannot start)."""


class KubeError(Exception):
    """The API server refused or failed a request (its HTTP status and message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class NotGranted(Exception):
    """A call outside :data:`CALLS`: a bug (the chart's RBAC would refuse it too), raised
    before anything is sent."""


def _granted(verb: str, kind: str, subresource: str = "") -> None:
    if (verb, kind, subresource) not in CALLS:
        raise NotGranted(f"{verb} {kind}{'/' + subresource if subresource else ''}")


class EvictionRefused(KubeError):
    """429: the eviction would breach a PodDisruptionBudget (or the API server is
    throttling it); the pod is left running, to be tried again later."""


def _ssl(info: kopf.ConnectionInfo) -> ssl.SSLContext | bool:
    if info.insecure:
        return False
    context = ssl.create_default_context(cafile=str(info.ca_path) if info.ca_path else None)
    if info.ca_data:
        data = info.ca_data if isinstance(info.ca_data, bytes) else info.ca_data.encode()
        context.load_verify_locations(cadata=base64.b64decode(data).decode())
    if info.certificate_path or info.certificate_data:
        with tempfile.TemporaryDirectory() as tmp:
            cert = _to_file(tmp, "cert", info.certificate_path, info.certificate_data)
            key = _to_file(tmp, "key", info.private_key_path, info.private_key_data)
            context.load_cert_chain(cert, key)
    return context


def _to_file(tmp: str, name: str, path: object, data: str | bytes | None) -> str:
    if path:
        return str(path)
    raw = data if isinstance(data, bytes) else (data or "").encode()
    target = f"{tmp}/{name}"
    with open(target, "wb") as f:
        f.write(base64.b64decode(raw))
    return target


class Kube:
    def __init__(self, info: kopf.ConnectionInfo, *, token_file: Path | None = None) -> None:
        """``token_file``: where a newer token than ``info``'s is read after a 401 (the
        pod's service-account token: :data:`SERVICE_ACCOUNT_TOKEN`); None, never."""
        headers = {"Accept": "application/json"}
        self._scheme = info.scheme or "Bearer"
        self._token = info.token
        self._token_file = token_file
        auth = (
            aiohttp.BasicAuth(info.username, info.password or "")
            if info.username and not info.token
            else None
        )
        self._server = info.server.rstrip("/")
        self._session = aiohttp.ClientSession(
            headers=headers,
            auth=auth,
            connector=aiohttp.TCPConnector(ssl=_ssl(info)),
            timeout=aiohttp.ClientTimeout(total=30),
        )

    async def close(self) -> None:
        await self._session.close()

    @property
    def server(self) -> str:
        return self._server

    async def wait_reachable(self, timeout_s: float) -> None:
        """Wait until the API server answers ``GET /version`` (any HTTP answer), retrying
        connection failures with back-off for ``timeout_s`` (0: one attempt).

        Raises:
            KubeUnreachable: no answer within ``timeout_s``; it says the last failure.
            KubeError: 401, the API server refused the credentials.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        delay, attempts, last = 0.1, 0, ""
        while True:
            attempts += 1
            try:
                bound = max(deadline - loop.time(), 0.001) if timeout_s > 0 else None
                async with asyncio.timeout(bound):
                    sent = self._token
                    url = f"{self._server}/version"
                    async with self._session.get(url, headers=self._auth()) as response:
                        if response.status != 401:
                            return
                    if not await self._reload_token(sent):
                        raise KubeError(401, "the API server refused the credentials")
                    continue  # a rotated token: at once
            except aiohttp.ClientConnectorError as e:
                code = e.os_error.errno
                last = os.strerror(code).lower() if code and code > 0 else str(e)
            except aiohttp.ClientError as e:
                last = str(e) or type(e).__name__
            except TimeoutError:  # cut short by the deadline: the reason before it says more
                last = last or "no answer"
            left = deadline - loop.time()
            if left <= 0:
                raise KubeUnreachable(
                    f"cannot reach the Kubernetes API at {self._server} within {timeout_s:g} s "
                    f"({attempts} attempt{'s' if attempts > 1 else ''}; last: {last})"
                )
            await asyncio.sleep(min(delay, left))  # a retry's back-off, bounded by the deadline
            delay = min(delay * 2, 2.0)

    def _auth(self, headers: Mapping[str, str] | None = None) -> dict[str, str]:
        found = dict(headers or {})
        if self._token:
            found["Authorization"] = f"{self._scheme} {self._token}"
        return found

    async def _reload_token(self, refused: str | None) -> bool:
        """After a 401 for token ``refused``: take the token file's token; True when it is
        another (worth one more try), False when there is none or it is the same."""
        if self._token_file is None:
            return False
        if self._token != refused:  # another request has reloaded it meanwhile
            return True
        try:
            token = (await asyncio.to_thread(self._token_file.read_text)).strip()
        except OSError as e:
            log.warning("HTTP 401, and the token cannot be read again: %s", e)
            return False
        if not token or token == refused:
            return False
        log.info("HTTP 401: the service-account token was rotated; using the new one")
        self._token = token
        return True

    def _url(self, api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        url = f"{self._server}{base}/namespaces/{namespace}/{PLURALS[kind]}"
        return f"{url}/{name}" if name else url

    async def _call(
        self,
        method: str,
        url: str,
        body: Obj | None = None,
        content_type: str | None = None,
        params: Mapping[str, str] | None = None,
    ) -> Obj | None:
        headers = {"Content-Type": content_type} if content_type else {}
        while True:
            sent = self._token
            async with self._session.request(
                method, url, json=body, headers=self._auth(headers), params=params
            ) as response:
                if response.status == 404:
                    return None
                data = await response.json(content_type=None)
            if response.status == 401 and await self._reload_token(sent):
                continue  # with the token just read; its own 401 is final
            if response.status >= 400:
                message = data.get("message", "") if isinstance(data, dict) else str(data)
                raise KubeError(response.status, message)
            return dict(data)

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        """The object, or None when it does not exist.

        Raises:
            NotGranted: ``kind`` is not one of :data:`READ_KINDS`.
            KubeError: the API server refused or failed it.
        """
        _granted("get", kind)
        return await self._call("GET", self._url(api_version, kind, namespace, name))

    async def get_peering(self, name: str, namespace: str | None) -> Obj | None:
        """Kopf's peering object ``name``: the KopfPeering in ``namespace``, or the
        ClusterKopfPeering when ``namespace`` is None; None when it does not exist (nor
        its resource type: the CRDs missing).

        Raises:
            KubeError: the API server refused or failed it (403 under an RBAC without
                ``get`` on it).
        """
        kind = "ClusterKopfPeering" if namespace is None else "KopfPeering"
        _granted("get", kind)
        scope = "" if namespace is None else f"/namespaces/{namespace}"
        url = f"{self._server}/apis/kopf.dev/v1{scope}/{PLURALS[kind]}/{name}"
        return await self._call("GET", url)

    async def apply(self, obj: Mapping[str, Any]) -> Obj:
        """Server-side apply ``obj``, the whole configuration the operator wants of it, as
        field manager :data:`FIELD_MANAGER` with ``force``; the object as stored after it.

        One request, idempotent: the object is created when absent; a field this manager
        applied before and ``obj`` no longer has is removed (a JSON merge patch would leave
        it on the live object); fields others own stay (a controller's status, an
        annotation ``kubectl rollout restart`` added); ``force`` takes over a field another
        manager set to another value instead of failing with a conflict (the operator's
        word is the spec's).

        A child created by an operator before this one (a POST, then JSON merge patches)
        has its fields owned by that older client too (an ``Update`` manager named after
        its User-Agent): Kubernetes then keeps a field this manager drops until that
        entry is removed from ``managedFields`` (docs/kubernetes.md, "How the operator
        applies").

        Raises:
            NotGranted: not a child kind (:data:`CHILD_KINDS`).
            KubeError: the API server refused or failed it (its status and message); 404
                when the resource type or the namespace does not exist.
        """
        meta = obj["metadata"]
        api_version, kind = obj["apiVersion"], obj["kind"]
        _granted("patch", kind)
        applied = await self._call(
            "PATCH",
            self._url(api_version, kind, meta["namespace"], meta["name"]),
            dict(obj),
            APPLY_PATCH,
            {"fieldManager": FIELD_MANAGER, "force": "true"},
        )
        if applied is None:
            raise KubeError(404, f"cannot apply {kind} {meta['name']}: no such resource")
        return applied

    async def patch_status(
        self, api_version: str, kind: str, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None:
        """Merge ``status`` into the resource's status (its ``status`` subresource), while
        a handler still runs: Kopf writes its own patch only when the handler returns.
        Each key given replaces the stored one whole (a list, ``conditions``, included).

        Raises:
            NotGranted: not a kind whose status the operator patches (:data:`CALLS`).
            KubeError: the API server refused or failed it; 404 when the resource is gone.
        """
        _granted("patch", kind, "status")
        url = self._url(api_version, kind, namespace, name) + "/status"
        found = await self._call("PATCH", url, {"status": dict(status)}, MERGE_PATCH)
        if found is None:
            raise KubeError(404, f"cannot patch the status of {kind} {name}: it is gone")

    async def evict_pod(self, namespace: str, name: str, uid: str) -> bool:
        """Evict pod ``name`` if it is still the pod ``uid`` (the Eviction subresource, with
        the uid as precondition: a pod replaced meanwhile, same name, another uid, is left
        alone). An eviction honours the PodDisruptionBudgets that select the pod, where a
        delete would not. True when this call evicted it (its controller then creates a
        new one), False when it was gone or replaced already.

        Raises:
            EvictionRefused: 429, a budget does not allow it now; the pod runs on.
            KubeError: the API server refused or failed it otherwise.
        """
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": uid}},
        }
        url = self._url("v1", "Pod", namespace, name) + "/eviction"
        try:
            found = await self._call("POST", url, body)
        except KubeError as e:
            if e.status == 409:  # the precondition failed: another pod by that name now
                return False
            if e.status == 429:
                raise EvictionRefused(429, str(e).removeprefix("HTTP 429: ")) from e
            raise
        return found is not None
