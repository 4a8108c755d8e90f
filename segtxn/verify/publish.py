"""A checked run's verdict and report, kept in a ConfigMap where the operator reads them.

In a VerificationRun (docs/kubernetes.md, "Spark in the cluster") the checker runs in the
driver pod, whose files go with the pod; the run's result must outlive it and reach the
operator, which has no way into the pod. So the driver writes, with its own service
account, one ConfigMap ``<run>-report``: ``verdict.json`` (:func:`verdict`: pass or fail,
the count of each anomaly kind), ``report.txt`` (the text summary) and ``report.html``
when it fits (:data:`MAX_HTML_BYTES`; a bigger report stays on the run's volume and the
verdict says where). The ConfigMap is owned by the VerificationRun, so it goes with it.

One server-side apply (field manager :data:`FIELD_MANAGER`): writing it again, e.g. by a
driver the kubelet restarted, replaces it whole instead of failing.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from segtxn.verify.checker import Report

FIELD_MANAGER = "segtxn-verify"
MAX_HTML_BYTES = 900 * 1024
"""A ConfigMap holds at most 1 MiB in all; the verdict and summary need the rest."""
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
OWNER_ENV = "SEGTXN_REPORT_OWNER"
NAMESPACE_ENV = "SEGTXN_REPORT_NAMESPACE"
VERDICT_KEY, SUMMARY_KEY, HTML_KEY = "verdict.json", "report.txt", "report.html"
RUN_LABEL = "segtxn.io/verification-run"
"""The label every object of a run carries (its value: the run's name, the owner's)."""


class PublishError(Exception):
    """The report could not be published: no in-cluster credentials or target, or the API
    server refused or failed the write (its HTTP status and message)."""


@dataclass(frozen=True)
class Target:
    """Where the report goes: ConfigMap ``name`` in ``namespace``, owned by ``owner`` (an
    ownerReference: the VerificationRun)."""

    namespace: str
    name: str
    owner: Mapping[str, Any]

    @classmethod
    def from_env(cls, name: str, env: Mapping[str, str]) -> Target:
        """The namespace and owner from the variables the operator renders into the driver
        (``SEGTXN_REPORT_NAMESPACE``, ``SEGTXN_REPORT_OWNER``: an ownerReference as JSON).

        Raises:
            PublishError: a variable is missing or the owner is not an ownerReference.
        """
        namespace, raw = env.get(NAMESPACE_ENV), env.get(OWNER_ENV)
        if not namespace or not raw:
            raise PublishError(f"publishing the report needs {NAMESPACE_ENV} and {OWNER_ENV}")
        try:
            owner = json.loads(raw)
        except json.JSONDecodeError as e:
            raise PublishError(f"{OWNER_ENV} is not JSON: {e}") from e
        wanted = {"apiVersion", "kind", "name", "uid"}
        if not isinstance(owner, dict) or not wanted <= owner.keys():
            raise PublishError(f"{OWNER_ENV} must be an ownerReference with {sorted(wanted)}")
        return cls(namespace, name, owner)


@dataclass(frozen=True)
class Api:
    """How to reach the API server: its URL, a bearer token, the CA to trust (None: the
    system's; a plain ``http://`` server needs none)."""

    server: str
    token: str
    ca_file: Path | None = None

    @classmethod
    def in_cluster(cls, env: Mapping[str, str]) -> Api:
        """The pod's own service account (the variables and files the kubelet provides).

        Raises:
            PublishError: not in a pod with a service account token.
        """
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
        token = SERVICE_ACCOUNT / "token"
        if not host or not port or not token.exists():
            raise PublishError("not in a Kubernetes pod with a service account token")
        server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        return cls(server, token.read_text().strip(), SERVICE_ACCOUNT / "ca.crt")


def verdict(report: Report, drained: bool, passed: bool | None = None) -> dict[str, Any]:
    """The run's verdict: ``passed`` (what ``segtxn verify check`` exits 0 for; default:
    no anomaly was found and every input was consumed); each anomaly kind's count."""
    return {
        "passed": report.anomalies == 0 and drained if passed is None else passed,
        "anomalies": report.anomalies,
        "counts": dict(sorted(report.counts.items())),
        "drained": drained,
    }


def config_map(
    target: Target, result: Mapping[str, Any], summary: str, html: str, html_path: Path
) -> Any:
    """The ConfigMap as applied; the verdict's ``report`` says where the HTML report is
    (``configmap``, or ``volume``: only at ``reportPath`` on the run's volume)."""
    fits = len(html.encode()) <= MAX_HTML_BYTES
    result = {**result, "report": "configmap" if fits else "volume", "reportPath": str(html_path)}
    data = {VERDICT_KEY: json.dumps(result, sort_keys=True), SUMMARY_KEY: summary}
    if fits:
        data[HTML_KEY] = html
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": target.name,
            "namespace": target.namespace,
            "labels": {
                "app.kubernetes.io/name": "segtxn",
                "app.kubernetes.io/component": "verify-report",
                RUN_LABEL: str(target.owner["name"]),
            },
            "ownerReferences": [dict(target.owner)],
        },
        "data": data,
    }


def publish(api: Api, target: Target, body: Mapping[str, Any], timeout_s: float = 30) -> None:
    """Server-side apply ``body`` (:func:`config_map`) as :data:`FIELD_MANAGER`.

    Raises:
        PublishError: the API server refused or failed it, or did not answer in time.
    """
    url = (
        f"{api.server}/api/v1/namespaces/{target.namespace}/configmaps/{target.name}"
        f"?fieldManager={FIELD_MANAGER}&force=true"
    )
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="PATCH",
        headers={
            "Content-Type": "application/apply-patch+yaml",
            "Authorization": f"Bearer {api.token}",
            "Accept": "application/json",
        },
    )
    context = None
    if api.server.startswith("https://"):
        context = ssl.create_default_context(cafile=str(api.ca_file) if api.ca_file else None)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
            response.read()
    except urllib.error.HTTPError as e:
        raise PublishError(
            f"writing ConfigMap {target.namespace}/{target.name}: HTTP {e.code}: "
            f"{e.read().decode(errors='replace')[:500]}"
        ) from e
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        raise PublishError(f"writing ConfigMap {target.namespace}/{target.name}: {e}") from e


def publish_report(
    name: str,
    report: Report,
    drained: bool,
    summary: str,
    html_path: Path,
    *,
    passed: bool | None = None,
) -> None:
    """Publish the checked run's report into ConfigMap ``name``, from inside the driver pod.

    Raises:
        PublishError: see :meth:`Target.from_env`, :meth:`Api.in_cluster`, :func:`publish`.
    """
    env = dict(os.environ)
    target = Target.from_env(name, env)
    html = html_path.read_text()
    body = config_map(target, verdict(report, drained, passed), summary, html, html_path)
    publish(Api.in_cluster(env), target, body)
