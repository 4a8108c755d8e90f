"""Kopf handlers of VerificationRun: launch the run as a Spark-on-Kubernetes application and
follow it to its verdict.

On creation the operator renders the run (:mod:`.sparkapp`: the executor pod template's
ConfigMap, then the driver pod) against the cluster's broker Service and applies it as the
run's children; status ``phase`` becomes ``Pending`` with the driver pod's name and the
command that fetches the report. A daemon per unfinished run then reads the driver pod and
the report ConfigMap every ``verification_poll_s`` (:func:`.runphase.observe`) and writes
each change of phase straight to the status, with an event: ``Running`` (the workload,
then the check), then ``Succeeded`` (``Passed``) or ``Failed`` (``AnomaliesFound``,
``NotDrained``, or the run could not be checked: ``WorkloadFailed``, ``CheckFailed``,
``DriverGone``...) with the verdict's anomaly counts.

The spec is fixed once created (the CRD refuses changes): a run is one execution, and
running again is creating another VerificationRun, whose name names its topics. Deleting a
run needs no handler: the driver pod and the ConfigMaps are its children, the executor pods
the driver pod's, and Kubernetes' garbage collector removes them.
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import kopf

from segtxn.operator import render, sparkpolicy
from segtxn.operator.kube import KubeError
from segtxn.operator.runphase import IllegalTransition, Observation, Phase, advance, observe
from segtxn.operator.runtime import (
    API,
    GROUP,
    RETRY_S,
    VERSION,
    Runtime,
    apply_objects,
    cluster_spec,
    namespaced,
    now,
    runtime_of,
    track,
)
from segtxn.operator.sparkapp import InvalidRun, RunNames, check_name, render_run

PLURAL = "verificationruns"
KIND = "VerificationRun"

log = logging.getLogger(__name__)


def report_command(namespace: str, names: RunNames) -> str:
    """The one command that saves a run's HTML report (docs/kubernetes.md)."""
    return (
        f"kubectl -n {namespace} get configmap {names.report} "
        "-o jsonpath='{.data.report\\.html}' > report.html"
    )


def _event(body: kopf.Body, seen: Observation, report: str | None = None) -> None:
    """One event per change of phase or reason; a verdict's names where its report is."""
    message = f"{seen.message}; report: {report}" if report and seen.verdict else seen.message
    if seen.phase is Phase.FAILED:
        kopf.warn(body, reason=seen.reason, message=message)
    else:
        kopf.info(body, reason=seen.reason, message=message)


@kopf.on.create(GROUP, VERSION, PLURAL)
async def run_created(
    *,
    name: str,
    namespace: str | None,
    uid: str,
    spec: kopf.Spec,
    body: kopf.Body,
    memo: kopf.Memo,
    patch: kopf.Patch,
    **_: Any,
) -> None:
    """Render and apply the run; a name that cannot name its objects, a run the operator's
    :class:`.sparkpolicy.SparkPolicy` refuses (no pod is created), or children the API
    server refuses, end the run as Failed (a Warning event) rather than retrying."""
    runtime = runtime_of(memo)
    ns = namespaced(namespace)
    try:
        names = check_name(name)
    except InvalidRun as e:
        failed = Observation(Phase.FAILED, "InvalidName", str(e))
        patch.status.update(failed.status())
        _event(body, failed)
        return
    try:
        sparkpolicy.check(spec, runtime.config.spark)
    except sparkpolicy.RunRefused as e:
        failed = Observation(Phase.FAILED, e.reason, str(e))
        patch.status.update(failed.status())
        _event(body, failed)
        return
    cluster = str(spec["clusterRef"])
    url = render.service_url(cluster, ns, await cluster_spec(runtime, ns, cluster))
    try:
        await apply_objects(runtime, body, render_run(name, ns, uid, dict(spec), url))
    except kopf.PermanentError as e:
        failed = Observation(Phase.FAILED, "ApplyFailed", str(e))
        patch.status.update(failed.status())
        _event(body, failed)
        return
    executors = spec["executors"]["instances"]
    started = Observation(
        Phase.PENDING,
        "Launched",
        f"driver pod {names.driver}: the workload against {url}, then spark-submit with "
        f"{executors} executor{'s' if executors != 1 else ''}",
    )
    patch.status.update(
        started.status()
        | {
            "driverPod": names.driver,
            "reportConfigMap": names.report,
            "report": report_command(ns, names),
            "startTime": now(),
        }
    )
    _event(body, started)


def _unfinished(status: kopf.Status, **_: Any) -> bool:
    """Runs to follow: launched (a phase) and not finished."""
    phase = status.get("phase")
    return phase is not None and not Phase(phase).finished


async def _look(runtime: Runtime, namespace: str, names: RunNames) -> Observation:
    try:
        pod = await runtime.kube.get("v1", "Pod", namespace, names.driver)
        report = await runtime.kube.get("v1", "ConfigMap", namespace, names.report)
    except (KubeError, aiohttp.ClientError, TimeoutError) as e:
        raise kopf.TemporaryError(f"reading run {names.run}: {e!r}", delay=RETRY_S) from e
    except RuntimeError as e:  # aiohttp's "Session is closed": the operator stopped meanwhile
        if runtime.closed:
            raise kopf.TemporaryError("the operator is stopping", delay=60) from e
        raise
    return observe(pod, report)


@kopf.daemon(GROUP, VERSION, PLURAL, when=_unfinished, cancellation_timeout=5)
async def follow_run(
    *,
    name: str,
    namespace: str | None,
    body: kopf.Body,
    memo: kopf.Memo,
    stopped: kopf.DaemonStopped,
    **_: Any,
) -> None:
    """Until the run is finished: each change of phase (or reason) into status, with an
    event. Returns once it is finished; a daemon is started again only by an operator
    restart, and then not for a finished run (:func:`_unfinished`)."""
    if track(memo, stopped):  # started again while the operator stops: nothing to do
        return
    runtime = runtime_of(memo)
    ns, names = namespaced(namespace), RunNames(name)
    # What this daemon wrote last: the live body shows a write only once it is watched back.
    phase = Phase(body.status.get("phase", Phase.PENDING.value))
    reason = body.status.get("reason")
    while not stopped and not phase.finished and not runtime.closed:
        seen = await _look(runtime, ns, names)
        try:
            advance(phase, seen.phase)
        except IllegalTransition as e:  # a pod status that lags behind an earlier read
            log.debug("run %s: %s; kept", name, e)
        else:
            if (seen.phase, seen.reason) != (phase, reason):
                await _write(runtime, ns, name, seen)
                _event(body, seen, report_command(ns, names))
                phase, reason = seen.phase, seen.reason
                continue
        await stopped.wait(runtime.config.verification_poll_s)


async def _write(runtime: Runtime, namespace: str, name: str, seen: Observation) -> None:
    fields = seen.status()
    if seen.phase.finished:
        fields["completionTime"] = now()
    try:
        await runtime.kube.patch_status(API, KIND, namespace, name, fields)
    except (KubeError, aiohttp.ClientError, TimeoutError) as e:
        raise kopf.TemporaryError(f"writing the status of run {name}: {e!r}", delay=RETRY_S) from e
