"""kmock's Kubernetes emulator made faithful enough for Kopf and the operator, and Kopf run
against it.

kmock 0.8 stores POST bodies as sent, merges every PATCH body whatever its Content-Type, and
replays every object on each WATCH. Kopf and the operator rely on what a real API server
does, so the subclass adds it: uid, resourceVersion (bumped on every write, so Kopf's
JSON-patch ``test`` ops pass), namespace from the URL, names from ``generateName`` (events),
a LIST resourceVersion that WATCH honours, subscription to changes before the replay
snapshot, 422 (not 500) for a failed patch test, a pod's Eviction subresource (a delete
with its uid precondition; :attr:`Emulator.refuse_evictions` answers 429 as a
PodDisruptionBudget would: budgets themselves are not computed), and server-side apply (a PATCH with
``application/apply-patch+yaml`` and a ``fieldManager``: created when absent, fields the
manager no longer applies removed; :mod:`tests.operator.ssa` says how faithfully). Still
absent, so tests do it themselves: schema validation and defaulting, garbage collection of
owned objects, label selectors, and controllers (a StatefulSet's status is patched by the
test, and its pods made by the test: :attr:`Emulator.deleted` says when one goes).
``metadata.generation`` is kept for segtxn resources (1 on create, +1 on a patch that
carries ``spec``: the tests' patches change what they carry) and for what the operator
applies (:func:`tests.operator.ssa.with_generation`: 1 on create, +1 on a spec change).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, NamedTuple

import aiohttp
import jsonpatch
import kmock
import kopf
from aiohttp import web

from tests.manifests.support import crd_schemas
from tests.manifests.test_crds import defaulted
from tests.operator import ssa

NS = "segtxn"
TESTS_AGENT = "segtxn-tests"
"""The User-Agent of the tests' own requests (:meth:`Emulator.call`)."""
API = "segtxn.io/v1alpha1"
PLURALS = {
    "SegtxnCluster": "segtxnclusters",
    "TransactionCoordinator": "transactioncoordinators",
    "ScalableTopic": "scalabletopics",
    "VerificationRun": "verificationruns",
}
RESOURCES: dict[str, dict[str, Any]] = {
    "v1/namespaces": {"kind": "Namespace", "namespaced": False},
    "v1/events": {"kind": "Event", "namespaced": True},
    "v1/configmaps": {"kind": "ConfigMap", "namespaced": True},
    "v1/secrets": {"kind": "Secret", "namespaced": True},
    "cert-manager.io/v1/certificates": {"kind": "Certificate", "namespaced": True},
    "cert-manager.io/v1/issuers": {"kind": "Issuer", "namespaced": True},
    "v1/services": {"kind": "Service", "namespaced": True},
    "apps/v1/deployments": {"kind": "Deployment", "namespaced": True, "subresources": ["status"]},
    "apps/v1/statefulsets": {"kind": "StatefulSet", "namespaced": True, "subresources": ["status"]},
    "policy/v1/poddisruptionbudgets": {"kind": "PodDisruptionBudget", "namespaced": True},
    "v1/pods": {"kind": "Pod", "namespaced": True, "subresources": ["status"]},
    "kopf.dev/v1/kopfpeerings": {"kind": "KopfPeering", "namespaced": True},
    "kopf.dev/v1/clusterkopfpeerings": {"kind": "ClusterKopfPeering", "namespaced": False},
    **{
        f"{API}/{plural}": {
            "kind": kind,
            "singular": kind.lower(),
            "namespaced": True,
            "subresources": ["status"],
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
        }
        for kind, plural in PLURALS.items()
    },
}


class Sent(NamedTuple):
    """One request as RBAC sees it."""

    method: str
    group: str
    plural: str
    subresource: str
    watching: bool
    named: bool
    existed: bool
    """The named object existed before the request."""
    apply: bool
    """A server-side apply (it creates what does not exist)."""


class Emulator(kmock.KubernetesEmulator):
    _rv = 0  # class-wide and monotonic: only the order matters

    @classmethod
    def _next_rv(cls) -> str:
        cls._rv += 1
        return str(cls._rv)

    failing: dict[str, int]
    """Resource (``policy/v1/poddisruptionbudgets``) -> the HTTP status every create or
    patch of it gets, for tests of what the operator does when an apply fails."""
    refuse_evictions: str | None = None
    """When set, every eviction is refused with 429 and this message (a budget that does
    not allow one now)."""
    requests: list[Sent] | None = None
    """When a list, every API request but the tests' own (:meth:`call`) and discovery's is
    appended: what RBAC would be asked for (tests/operator/test_rbac.py)."""
    status_patches: list[tuple[str, Any]] | None = None
    """When a list, (name, body) of every PATCH of a segtxn resource's status
    subresource, in order: what a handler wrote while it ran."""
    tokens: frozenset[str] | None = None
    """When set, a request (but the tests' own) without ``Bearer <one of these>`` is refused
    with 401, as a real API server refuses a rotated-out service-account token; each
    refused Authorization header is appended to :attr:`unauthorized`."""
    unauthorized: list[str]
    gate: Callable[[kmock.Request], Awaitable[None]] | None = None
    """When set, awaited before each of the operator's requests is served (not the tests'
    own): a test holds one there on an :class:`asyncio.Event` to make a race happen on
    purpose (what the operator does while that request is in flight)."""
    deleted: Callable[[str, str], None] | None = None
    """Told (plural, name: ``("pods", "demo-broker-2")``) of each object a DELETE
    removed, once it is: tests that play a controller (a StatefulSet's) react to it."""

    async def _handle(self, request: kmock.Request) -> Any:
        data = request.data
        agent = next((v for k, v in request.headers.items() if k.lower() == "user-agent"), "")
        if self.tokens is not None and agent != TESTS_AGENT:
            sent = next((v for k, v in request.headers.items() if k.lower() == "authorization"),
                        "")  # fmt: skip
            if sent.removeprefix("Bearer ") not in self.tokens:
                self.unauthorized = [*getattr(self, "unauthorized", []), sent]
                raise kmock.KubernetesError(status=401, reason="Unauthorized", message="no")
        if self.requests is not None and agent != TESTS_AGENT:
            self._record(request, self.requests)
        if self.gate is not None and agent != TESTS_AGENT:
            await self.gate(request)
        status_patch = request.subresource == "status" and request.method == "PATCH"
        if self.status_patches is not None and _ours(request) and status_patch:
            self.status_patches.append((str(request.name), data))
        if request.subresource == "eviction" and request.method == "POST":
            return await self._evict(request)
        writes = (kmock.action.CREATE, kmock.action.UPDATE)
        for resource, code in getattr(self, "failing", {}).items():
            if request.resource == kmock.resource(resource) and request.action in writes:
                raise kmock.KubernetesError(status=code, reason="Injected", message="injected")
        if request.action == kmock.action.UPDATE and _content_type(request) == ssa.APPLY_PATCH:
            await self._apply(request)
        if request.resource is not None and request.action == kmock.action.CREATE:
            if isinstance(data, dict):
                meta = data.setdefault("metadata", {})
                if request.namespace:
                    meta.setdefault("namespace", request.namespace)
                if not meta.get("name") and meta.get("generateName"):
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("creationTimestamp", _now())
                meta["resourceVersion"] = self._next_rv()
                if _ours(request):
                    meta["generation"] = 1
        elif request.resource is not None and request.action == kmock.action.UPDATE:
            if isinstance(data, dict):  # merge patch
                data.setdefault("metadata", {})["resourceVersion"] = self._next_rv()
                if _ours(request) and not request.subresource and "spec" in data:
                    assert request.name is not None  # a patch of a segtxn resource names it
                    key = (request.resource, request.namespace, request.name)
                    obj = self.objects._objects.get(key)
                    old = int(obj.raw.get("metadata", {}).get("generation", 0)) if obj else 0
                    data["metadata"]["generation"] = old + 1  # a spec change, as the tests make
            elif isinstance(data, list):  # JSON patch: bump after Kopf's `test` op
                data.append(
                    {"op": "add", "path": "/metadata/resourceVersion", "value": self._next_rv()}
                )
        elif request.resource is not None and request.action == kmock.action.DELETE:
            obj = None
            if request.name is not None:  # not a delete of a whole collection
                obj = self.objects._objects.get((request.resource, request.namespace, request.name))
            meta = obj.raw.get("metadata", {}) if obj is not None else {}
            pending = meta.get("finalizers") and not meta.get("deletionTimestamp")
            if obj is not None and not obj.deleted and pending:  # kmock soft-deletes it next
                obj.patch({"metadata": {"resourceVersion": self._next_rv()}})
        try:
            result = await super()._handle(request)
        except jsonpatch.JsonPatchTestFailed as e:  # what a real API server answers
            raise kmock.KubernetesError(status=422, reason="Invalid", message=str(e)) from e
        if request.action == kmock.action.DELETE and request.resource and self.deleted:
            assert request.resource.plural is not None  # a delete's URL names its resource
            self.deleted(request.resource.plural, str(request.name))
        return result

    def _record(self, request: kmock.Request, into: list[Sent]) -> None:
        target = request.resource
        if target is None or not target.plural:  # discovery: no grant needed
            return
        assert target.group is not None  # from the URL: "" for the core group
        key = (target, request.namespace, request.name)
        existed = key in self.objects._objects and not self.objects._objects[key].deleted
        method = getattr(request.method, "value", str(request.method))
        watching = request.params.get("watch", "") == "true"
        apply = _content_type(request) == ssa.APPLY_PATCH
        named = request.name is not None
        sub = request.subresource or ""
        into.append(Sent(method, target.group, target.plural, sub, watching, named, existed, apply))

    async def _evict(self, request: kmock.Request) -> Any:
        """A pod's eviction: 429 while :attr:`refuse_evictions`, 409 when its uid
        precondition fails, 404 when there is no such pod; else the pod is deleted (as
        an eviction the budget allows does) and a Status answers 201."""
        if self.refuse_evictions is not None:
            raise kmock.KubernetesError(
                status=429, reason="TooManyRequests", message=self.refuse_evictions
            )
        pods, name = request.resource, request.name
        assert pods is not None and pods.plural is not None and name is not None  # pods/N/eviction
        obj = self.objects._objects.get((pods, request.namespace, name))
        if obj is None or obj.deleted:
            raise kmock.KubernetesError(status=404, reason="NotFound", message="no such pod")
        wanted = ((request.data or {}).get("deleteOptions") or {}).get("preconditions", {})
        if wanted.get("uid") and wanted["uid"] != obj.raw.get("metadata", {}).get("uid"):
            raise kmock.KubernetesError(status=409, reason="Conflict", message="uid differs")
        async with self._lock:
            raw = dict(obj.raw)
            obj.delete()
            await self._buses[pods].put({"type": "DELETED", "object": raw})
        if self.deleted:
            self.deleted(pods.plural, str(request.name))
        status = {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}
        return web.json_response(status, status=201)

    async def _apply(self, request: kmock.Request) -> None:
        """Server-side apply (:mod:`tests.operator.ssa`), handed on to kmock as what it
        knows: the object created first when absent, then the request's body rewritten in
        place into the merge patch from the stored object to the applied outcome.

        Raises:
            kmock.KubernetesError: 422 without ``?fieldManager=`` (as Kubernetes answers),
                400 for a body that is not an object.
        """
        manager = request.params.get("fieldManager", "")
        if not manager:
            raise kmock.KubernetesError(
                status=422, reason="Invalid", message="fieldManager is required for apply patch"
            )
        data = request.data
        if not isinstance(data, dict):
            raise kmock.KubernetesError(status=400, reason="BadRequest", message="not an object")
        resource = request.resource
        assert resource is not None and request.name is not None  # a PATCH of a named object
        key = (resource, request.namespace, request.name)
        async with self._lock:
            obj = self.objects._objects.get(key)
            live = None if obj is None or obj.deleted else dict(obj.raw)
            outcome = ssa.with_generation(live, ssa.apply(live, data, manager, _now()))
            if live is None:  # an apply creates what does not exist
                meta = outcome["metadata"]
                meta.setdefault("namespace", request.namespace)
                meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now())
                meta["resourceVersion"] = self._next_rv()
                if obj is None:
                    self.objects._objects[key] = kmock.Object(outcome)
                else:
                    obj.create(outcome)
                await self._buses[resource].put({"type": "ADDED", "object": outcome})
                live = outcome
            patch = ssa.merge_patch(live, outcome)
        data.clear()  # the UPDATE below (kmock's merge) now lands exactly on the outcome
        data.update(patch)

    async def _serve_list(self, request: kmock.Request) -> Any:
        rv = str(self._rv)  # before the snapshot: later writes are replayed by WATCH
        result = await super()._serve_list(request)
        assert isinstance(result, dict)  # kmock's list: {"metadata": ..., "items": ...}
        result["metadata"]["resourceVersion"] = rv
        return result

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        """Subscribe first, then replay objects changed after ?resourceVersion=."""
        yield b""
        since = request.params.get("resourceVersion", "")
        since_rv = int(since) if since.isdigit() else -1
        assert request.resource is not None  # a watch is of a resource
        bus = self._buses[request.resource]
        mark = await bus.mark()
        try:
            async with self._lock:
                # kmock's private helpers, by their mangled names (no public equivalent)
                get_objs = self._KubernetesEmulator__get_objs  # type: ignore[attr-defined]
                objs = get_objs(request, strict=False)
                events = [
                    {"type": "ADDED", "object": o.raw}
                    for o in objs
                    if not o.deleted and _rv(o.raw) > since_rv
                ]
            for event in events:
                yield event
            async for event in bus.stream(since=mark):
                meta = event.get("object", {}).get("metadata", {})
                if self._KubernetesEmulator__check(  # type: ignore[attr-defined]  # kmock's, mangled
                    request, request.resource, meta.get("namespace"), meta.get("name"), strict=False
                ):
                    yield event
        finally:
            await bus.unmark(mark)

    # ------------------------------------------------------------------ test helpers

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One API call through a throw-away session (a kept-alive connection would hold
        Kopf's shutdown for 5 s)."""
        headers = {"User-Agent": TESTS_AGENT}
        if method == "PATCH":
            headers["Content-Type"] = "application/merge-patch+json"
        async with (
            aiohttp.ClientSession(str(self.url)) as session,
            session.request(method, path, json=body, headers=headers) as response,
        ):
            return response.status, await response.json(content_type=None)

    async def create(self, kind: str, name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Create a segtxn resource as the API server would store it (CRD defaults)."""
        doc = {"apiVersion": API, "kind": kind, "metadata": {"name": name, "namespace": NS},
               "spec": dict(spec)}  # fmt: skip
        doc = defaulted(doc, crd_schemas()[(API, kind)])
        status, body = await self.call("POST", f"/apis/{API}/namespaces/{NS}/{PLURALS[kind]}", doc)
        assert status in (200, 201), body
        return dict(body)

    # The tests' helpers shadow kmock's client shortcuts (get/patch/delete of a URL),
    # which nothing calls on an emulator here.
    async def patch(  # type: ignore[override]
        self, kind: str, name: str, patch: Mapping[str, Any]
    ) -> None:
        path = f"/apis/{API}/namespaces/{NS}/{PLURALS[kind]}/{name}"
        status, body = await self.call("PATCH", path, dict(patch))
        assert status == 200, body

    async def delete(self, kind: str, name: str) -> None:  # type: ignore[override]
        path = f"/apis/{API}/namespaces/{NS}/{PLURALS[kind]}/{name}"
        status, body = await self.call("DELETE", path)
        assert status == 200, body

    def get(self, resource: str, name: str) -> dict[str, Any] | None:  # type: ignore[override]
        """The live object (``resource`` like ``apps/v1/statefulsets``), None if absent."""
        key = (kmock.resource(resource), NS, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return dict(self.objects[key].raw)

    def mine(self, kind: str, name: str) -> dict[str, Any] | None:
        return self.get(f"{API}/{PLURALS[kind]}", name)

    def events(self, name: str) -> list[tuple[str, str, str]]:
        """(type, reason, message) of the events posted about ``name``."""
        return [
            (o.raw.get("type", ""), o.raw.get("reason", ""), o.raw.get("message", ""))
            for (resource, _, _), o in list(self.objects.items())
            if resource == kmock.resource("v1/events")
            and not o.deleted
            and o.raw["involvedObject"]["name"] == name
        ]


def _ours(request: kmock.Request) -> bool:
    """A segtxn resource: the emulator keeps its generation on every write, as an API
    server does (of built-in kinds, only what the operator applies: :meth:`_apply`)."""
    return bool(request.resource is not None and request.resource.group == "segtxn.io")


def _content_type(request: kmock.Request) -> str:
    found = next((v for k, v in request.headers.items() if k.lower() == "content-type"), "")
    return str(found).split(";")[0].strip()


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


def _rv(raw: Mapping[str, Any]) -> int:
    rv = str(raw.get("metadata", {}).get("resourceVersion") or "0")
    return int(rv) if rv.isdigit() else 0


@contextlib.asynccontextmanager
async def emulator() -> AsyncIterator[Emulator]:
    async with Emulator() as emu, kmock.Server(emu):
        for resource, info in RESOURCES.items():
            emu.resources[resource] = kmock.ResourceInfo(**info)
        yield emu


def settings() -> kopf.OperatorSettings:
    """Against the emulator: quick retries, event posting that stops at once."""
    s = kopf.OperatorSettings()
    s.scanning.disabled = True
    s.posting.idle_timeout = 0.05
    s.persistence.consistency_timeout = 1.0
    s.watching.reconnect_backoff = 0.05
    s.networking.error_backoffs = [0.1, 0.2, 0.5]
    return s


STOP_S = 15.0
"""How long the operator may take to stop. What Kopf's stop takes (kopf 1.45,
``_core/reactor/running.py`` and ``queueing.py``): its daemons and timers are told to stop
and return at once; its workers finish the events they hold, and one sleeping in a retry
delay (a handler's ``TemporaryError(delay=...)``) is not woken but cancelled after
``settings.queueing.exit_timeout`` (2 s); then the clean-up handler; then every task still
running is given a fixed 5 s and cancelled. A stop that takes longer than this bound has a
task that does not end when cancelled: the failure names what was still running."""


@contextlib.asynccontextmanager
async def operator(emu: Emulator, memo: kopf.Memo, **kwargs: Any) -> AsyncIterator[None]:
    """The segtxn operator (its handlers module) running in this loop against ``emu``.

    Enter it in the test body, not in an async-generator fixture: on stop, Kopf waits for
    and then cancels every task created after it started, a fixture's teardown included.
    Stopped within :data:`STOP_S`."""
    from segtxn.operator import handlers  # registers the handlers
    from tests.operator import login  # and how they reach the emulator

    assert login.login

    assert handlers.FINALIZER
    memo["connection"] = kopf.ConnectionInfo(server=str(emu.url), insecure=True)
    stop, ready = asyncio.Event(), asyncio.Event()
    kwargs.setdefault("standalone", True)
    task = asyncio.create_task(
        kopf.operator(
            stop_flag=stop,
            ready_flag=ready,
            memo=memo,
            namespaces=[NS],
            settings=settings(),
            **kwargs,
        )
    )
    await asyncio.wait_for(ready.wait(), timeout=10)
    try:
        yield
    finally:
        stop.set()
        await _stopped(task)


async def _stopped(task: asyncio.Task[None]) -> None:
    """Wait for the operator's task to end, at most :data:`STOP_S`; past that, fail
    naming the tasks still running (then cancel it, as Kopf would its leftovers)."""
    done, _ = await asyncio.wait({task}, timeout=STOP_S)
    if task in done:
        task.result()  # its error, if it failed
        return
    running = sorted(
        f"{t.get_name()}: {getattr(t.get_coro(), '__qualname__', t.get_coro())}"
        for t in asyncio.all_tasks()
        if t is not asyncio.current_task() and not t.done()
    )
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise AssertionError(f"the operator did not stop within {STOP_S:g} s; running: {running}")
