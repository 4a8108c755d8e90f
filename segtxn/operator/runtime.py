"""What every handler shares: the operator's configuration, its clients, and how a child
is applied and an error becomes a Kopf retry.

Split from the handlers so that each resource's handlers (:mod:`.clusters`,
:mod:`.coordinators`, :mod:`.scalabletopics`) read as what they decide, not as plumbing.
Nothing here is registered with Kopf.
"""

from __future__ import annotations

import copy
import datetime
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import aiohttp
import kopf

from segtxn.client.admin import Admin
from segtxn.client.connection import Connector
from segtxn.client.errors import Timeout
from segtxn.operator import render
from segtxn.operator.kube import Kube, KubeError
from segtxn.operator.rollstate import RollSettings
from segtxn.operator.sessions import ClusterSessions
from segtxn.operator.sparkpolicy import SparkPolicy
from segtxn.protocol.errors import (
    MetadataError,
    NotOwner,
    ServerError,
    ServiceNotReady,
    TooManyRequests,
    TopicBusy,
)

GROUP, VERSION = render.GROUP, render.VERSION
API = f"{GROUP}/{VERSION}"
FINALIZER = "segtxn.io/finalizer"
RETRY_S = 5.0
"""Delay before retrying what may heal by itself."""

_TRANSIENT = (ServiceNotReady, TopicBusy, TooManyRequests, MetadataError, NotOwner)


@dataclass(frozen=True)
class OperatorConfig:
    """How the operator reaches segtxn. In a pod it derives each cluster's Service URL
    (:func:`render.service_url`); run outside Kubernetes (a laptop, the tests) the URLs
    are given: every cluster is then reached there."""

    broker_url: str | None = None
    coordinator_url: str | None = None
    api_timeout_s: float = 15.0
    """At start-up, how long to keep trying to reach the Kubernetes API before giving up
    (a PermanentError: the operator exits saying so)."""
    roll: RollSettings = field(default_factory=RollSettings)
    """The brokers' rolling restart (:mod:`.rolling`) and the scale-down's drains."""
    verification_poll_s: float = 5.0
    """How often an unfinished VerificationRun's driver pod and report are read."""
    namespaces: tuple[str, ...] = ()
    """The namespaces Kopf is told to watch (``--namespace``; empty with
    ``--all-namespaces``): where the start-up check looks for the peering object
    (:mod:`.peering`)."""
    spark: SparkPolicy = field(default_factory=SparkPolicy)
    """What a VerificationRun's pods may be: service accounts, images, Spark settings."""


@dataclass
class Runtime:
    """What the handlers share, built at start-up (kept in Kopf's memo)."""

    config: OperatorConfig
    kube: Kube
    http: aiohttp.ClientSession
    closed: bool = False
    sessions: ClusterSessions = field(default_factory=ClusterSessions)
    """Sessions to clusters with security on (TLS with their CA, their admin token)."""
    stop_flags: weakref.WeakSet[kopf.DaemonStopped] = field(default_factory=weakref.WeakSet)
    """The ``stopped`` flags of the timers and daemons running now (:func:`track`):
    how the operator learns that Kopf is stopping it (:attr:`stopping`)."""

    @property
    def stopping(self) -> bool:
        """Kopf is stopping the operator: it has told a timer or daemon so
        (``OPERATOR_EXITING``, the first thing it does), or the clean-up has run."""
        exiting = kopf.DaemonStoppingReason.OPERATOR_EXITING
        return self.closed or any(
            flag.reason is not None and exiting in flag.reason for flag in self.stop_flags
        )


def runtime_of(memo: Any) -> Runtime:
    """The runtime built by the start-up handler; a retry while it is not there (yet)."""
    runtime = memo.get("runtime")
    if not isinstance(runtime, Runtime):
        raise kopf.TemporaryError("the operator is still starting", delay=1)
    if runtime.closed:  # timers may still tick while Kopf stops
        raise kopf.TemporaryError("the operator is stopping", delay=60)
    return runtime


def track(memo: Any, stopped: kopf.DaemonStopped) -> bool:
    """Every timer and daemon hands its ``stopped`` flag here at each run: True when the
    operator is stopping (:attr:`Runtime.stopping`), and the daemon should return.

    Why: Kopf 1.45 stops every timer and daemon first when the operator stops, then lets
    its workers finish the events they hold (``settings.queueing.exit_timeout``); an event
    of an object whose timer has just exited starts that timer again, and nothing stops
    the new one: Kopf cancels it only after its fixed 5 s grace for leftover tasks (and a
    new daemon that retries ``the operator is stopping`` would sleep in that delay until
    then). :func:`serving` keeps them from being started again."""
    runtime = memo.get("runtime")
    if not isinstance(runtime, Runtime):
        return False
    runtime.stop_flags.add(stopped)
    return runtime.stopping


def serving(memo: Any, **_: Any) -> bool:
    """The ``when=`` filter of every timer: False once the operator is stopping, so that
    Kopf does not start a timer it has just stopped again (:func:`track`)."""
    runtime = memo.get("runtime")
    return not (isinstance(runtime, Runtime) and runtime.stopping)


def snapshot(body: kopf.Body) -> kopf.Body:
    """A timer's ``body`` as it is now, a copy that no later event changes: a tick reads
    its spec, status and generation from it alone.

    Why: Kopf 1.45 hands a timer or daemon a live body (``_core/engines/daemons.py``,
    ``live_fresh_body``), replaced in place by each watch event, and its ``spec``,
    ``status`` and ``meta`` kwargs are views of it. A tick that awaits reads, after the
    await, the object as it is then: the cluster's status timer found the brokers running
    the spec it began with, then rendered the coordinators from the spec changed meanwhile
    and applied them before a single broker had rolled."""
    return kopf.Body(copy.deepcopy(cast(kopf.RawBody, dict(body))))


def namespaced(namespace: str | None) -> str:
    if namespace is None:  # the CRDs are namespaced: only a broken API server sends this
        raise kopf.PermanentError("segtxn resources are namespaced")
    return namespace


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def cluster_spec(runtime: Runtime, namespace: str, cluster: str) -> Mapping[str, Any]:
    """The spec of SegtxnCluster ``cluster``; a retry while it does not exist."""
    found = await runtime.kube.get(API, "SegtxnCluster", namespace, cluster)
    if found is None:
        raise kopf.TemporaryError(
            f"SegtxnCluster {namespace}/{cluster} does not exist (yet)", delay=RETRY_S
        )
    return dict(found.get("spec", {}))


async def admin(
    runtime: Runtime, namespace: str, cluster: str, spec: Mapping[str, Any] | None = None
) -> Admin:
    """The admin API of ``cluster``'s brokers (its Service, or the configured URL), over
    TLS with the admin token when its security is on (:mod:`.sessions`); ``spec``, the
    cluster's, when the caller has it (else it is read)."""
    if spec is None and runtime.config.broker_url is None:
        spec = await cluster_spec(runtime, namespace, cluster)
    elif spec is None:  # a configured URL: a cluster not there (yet) has no security
        found = await runtime.kube.get(API, "SegtxnCluster", namespace, cluster)
        spec = dict((found or {}).get("spec", {}))
    url = runtime.config.broker_url or render.service_url(cluster, namespace, spec)
    http = await runtime.sessions.session(runtime.kube, runtime.http, namespace, cluster, spec)
    return Admin(Connector(url, http, request_timeout_s=30))


def reason(e: ServerError | Timeout) -> str:
    """A condition's reason: the error's wire name, or Timeout (no answer in time)."""
    return e.name.value if isinstance(e, ServerError) else "Timeout"


def transient(e: ServerError | Timeout) -> bool:
    return isinstance(e, (Timeout, *_TRANSIENT))


def kopf_error(e: ServerError | Timeout, doing: str) -> kopf.TemporaryError | kopf.PermanentError:
    """Retry what may heal (brokers unreachable or not answering in time, a change in
    progress); not the rest."""
    if transient(e):
        return kopf.TemporaryError(f"{doing}: {e}", delay=RETRY_S)
    return kopf.PermanentError(f"{doing}: {e}")


async def apply_objects(runtime: Runtime, owner: kopf.Body, objects: list[render.Obj]) -> None:
    """Server-side apply ``objects`` as children of ``owner`` (owner references), in
    their order: one failing stops the rest, and what went before stays applied.

    Raises:
        kopf.PermanentError: Kubernetes refused a child as invalid or forbidden.
        kopf.TemporaryError: the API server failed or did not answer; retried.
    """
    kopf.adopt(objects, owner=owner)
    for obj in objects:
        child = f"{obj['kind']} {obj['metadata']['name']}"
        try:
            await runtime.kube.apply(obj)
        except KubeError as e:
            if e.status in (400, 403, 422):
                raise kopf.PermanentError(f"Kubernetes refused {child}: {e}") from e
            raise kopf.TemporaryError(f"applying {child}: {e}", delay=RETRY_S) from e
        except aiohttp.ClientError as e:
            raise kopf.TemporaryError(f"applying {child}: {e!r}", delay=RETRY_S) from e
