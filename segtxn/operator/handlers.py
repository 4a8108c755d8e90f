"""The operator's entry module: start-up, clean-up and the indexes, and every handler
registered (importing it is what ``segtxn operator`` and ``kopf run -m
segtxn.operator.handlers`` do).

Rendering is pure (:mod:`segtxn.operator.render`); the handlers that apply it live by
resource: :mod:`.clusters` (SegtxnCluster), :mod:`.coordinators`
(TransactionCoordinator), :mod:`.scalabletopics` and :mod:`.autoscaling` (ScalableTopic),
:mod:`.verification` (VerificationRun); a secured cluster's Secrets are kept and renewed
by :mod:`.credentials`. What they share (configuration, clients, error mapping) is
:mod:`.runtime`.
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import kopf

from segtxn.operator import (
    autoscaling,
    clusters,
    coordinators,
    credentials,
    peering,
    scalabletopics,
    verification,
)
from segtxn.operator.kube import SERVICE_ACCOUNT_TOKEN, Kube, KubeError, KubeUnreachable
from segtxn.operator.runtime import FINALIZER, GROUP, VERSION, OperatorConfig, Runtime

__all__ = [
    "FINALIZER",
    "OperatorConfig",
    "autoscaling",
    "clusters",
    "coordinators",
    "credentials",
    "scalabletopics",
    "verification",
]


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Progress and diff-base in annotations: status stays ours and matches the CRD schema.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = FINALIZER
    settings.posting.level = logging.INFO
    # The CRDs are installed before the operator (helm's crds/); no runtime discovery.
    settings.scanning.disabled = True
    config = memo.get("config") or OperatorConfig()
    token_file = None  # in a pod: the rotated token is re-read there after a 401
    try:
        info = memo.get("connection")
        if info is None:
            info = kopf.login_with_service_account(settings=settings)
            token_file = SERVICE_ACCOUNT_TOKEN if info is not None else None
        if info is None:
            info = kopf.login_with_kubeconfig(settings=settings)
    except (OSError, ValueError, KeyError, kopf.LoginError) as e:
        raise kopf.PermanentError(f"cannot read Kubernetes credentials: {e!r}") from e
    if info is None:
        raise kopf.PermanentError("no Kubernetes credentials (service account or kubeconfig)")
    kube = Kube(info, token_file=token_file)
    try:
        await kube.wait_reachable(config.api_timeout_s)
    except (KubeUnreachable, KubeError) as e:
        await kube.close()
        raise kopf.PermanentError(str(e)) from e
    except BaseException:
        await kube.close()
        raise
    memo["runtime"] = Runtime(config, kube, aiohttp.ClientSession())
    if settings.peering.mandatory and not settings.peering.standalone:
        # Kopf waits for the peering object without a word above DEBUG: say it once.
        scope = None if settings.peering.clusterwide else config.namespaces
        await peering.warn_if_missing(kube, settings.peering.name, scope)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    runtime = memo.get("runtime")
    if isinstance(runtime, Runtime):
        runtime.closed = True
        await runtime.kube.close()
        await runtime.http.close()
        await runtime.sessions.close()


# ---------------------------------------------------------------------- indexes


@kopf.index(GROUP, VERSION, "scalabletopics")
def topics_by_cluster(
    *, namespace: str | None, name: str, spec: kopf.Spec, **_: Any
) -> dict[tuple[str | None, str], str]:
    return {(namespace, str(spec.get("clusterRef"))): name}


@kopf.index(GROUP, VERSION, "transactioncoordinators")
def coordinators_by_cluster(
    *, namespace: str | None, name: str, spec: kopf.Spec, **_: Any
) -> dict[tuple[str | None, str], str]:
    return {(namespace, str(spec.get("clusterRef"))): name}
