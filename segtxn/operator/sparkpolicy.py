"""What a VerificationRun may ask of the pods the operator creates for it: the safety check
before a run's driver pod is rendered.

The operator creates the run's driver pod itself (:mod:`.sparkapp`), so whoever may create a
VerificationRun would otherwise run any image, as any service account of the namespace
(the operator's own included, whose Role reads the namespace's Secrets), with any
spark-submit configuration (jars and plugins fetched from anywhere, Secrets mounted into
the executors). Creating a run is creating a pod in its namespace; this module keeps that
pod to what an operator's administrator allowed (:class:`SparkPolicy`, from the
``--spark-service-account`` and ``--spark-image-prefix`` flags, which the chart sets):

- the service account: one of the allowed names, and never the operator's own;
- the image: under an allowed prefix (:func:`image_allowed`);
- ``sparkConf``: no key that changes what code runs, what it may read or which identity it
  runs as (:data:`DENIED_CONF`). A deny list: a key not on it passes, and Spark grows new
  keys; the rest of the run's pod is the operator's (Pod Security "restricted", no
  privileges), and the service account bounds what any code in it can do.

A refused run is ``Failed`` with the reason of :class:`RunRefused` and a Warning event; no
pod is created.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_SERVICE_ACCOUNT = "segtxn-spark"
"""The chart's Spark service account (``spark.serviceAccount.name``)."""
DEFAULT_IMAGE_PREFIX = "segtxn"
"""The chart's ``image.repository``: the verify image is ``segtxn-verify``."""

DENIED_CONF: tuple[str, ...] = (
    # Code fetched or added to the driver's and executors' class paths.
    "spark.jars*",  # jars, packages, repositories, ivy, ivySettings, excludes
    "spark.packages",
    "spark.repositories",
    "spark.files",
    "spark.archives",
    "spark.submit.*",  # pyFiles, deployMode
    "spark.master",
    "spark.*plugins",  # spark.plugins, spark.executor.plugins (loaded classes)
    "spark.*extraJavaOptions",
    "spark.*defaultJavaOptions",
    "spark.*extraClassPath",
    "spark.*extraLibraryPath",
    "spark.pyspark.*",  # the Python executable
    "spark.executorEnv.*",  # JAVA_TOOL_OPTIONS, LD_PRELOAD...
    "spark.kubernetes.driverEnv.*",
    "spark.*discoveryScript",  # resource discovery runs a script
    "spark.kubernetes.*decommissionScript",
    # What the executor pods are: their image, namespace, template, volumes, identity.
    "spark.kubernetes.*image*",  # container.image, executor.container.image, pullSecrets
    "spark.kubernetes.namespace",
    "spark.kubernetes.*podTemplateFile",
    "spark.kubernetes.*podTemplateContainerName",
    "spark.kubernetes.*volumes*",  # hostPath mounts
    "spark.kubernetes.*secret*",  # executor.secrets.*, secretKeyRef.*, kerberos token secret
    "spark.kubernetes.kerberos.*",
    "spark.kubernetes.authenticate.*",  # service accounts, OAuth tokens, client keys
    "spark.kubernetes.*serviceAccountName",
    "spark.kubernetes.file.upload.path",
    "spark.kubernetes.*pod.name",  # the executors' owner (their garbage collection)
)
"""``sparkConf`` keys a run may not set (shell-style patterns, case-insensitive): see
docs/kubernetes.md, "Spark in the cluster"."""


@dataclass(frozen=True)
class SparkPolicy:
    """What the operator lets a VerificationRun's pods be (the ``--spark-*`` flags)."""

    service_accounts: frozenset[str] = frozenset({DEFAULT_SERVICE_ACCOUNT})
    """Service account names a run may use (in its own namespace)."""
    image_prefixes: tuple[str, ...] = (DEFAULT_IMAGE_PREFIX,)
    """Image prefixes a run's image must be under (:func:`image_allowed`)."""
    operator_service_account: str | None = None
    """The operator's own service account: refused even when listed."""
    denied_conf: tuple[str, ...] = field(default=DENIED_CONF)


class RunRefused(Exception):
    """A run asks for what :class:`SparkPolicy` does not allow; ``reason`` names what."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def repository(image: str) -> str:
    """``image`` without its ``@digest`` and ``:tag`` (a registry's ``:port`` stays)."""
    name = image.split("@", 1)[0]
    colon, slash = name.rfind(":"), name.rfind("/")
    return name[:colon] if colon > slash else name


def image_allowed(image: str, prefix: str) -> bool:
    """Whether ``image`` is under ``prefix``.

    A prefix ending in ``/`` (``registry.example/segtxn/``) allows every image under that
    path. Otherwise the image's repository must start with the prefix in its last path
    part: ``segtxn`` allows ``segtxn:0.1.0`` and ``segtxn-verify:0.1.0`` but neither
    ``segtxn-x/evil`` (another Docker Hub account) nor ``segtxn.example/evil`` (another
    registry); ``ghcr.io/acme/segtxn`` allows ``ghcr.io/acme/segtxn-verify``.
    """
    repo = repository(image)
    if prefix.endswith("/"):
        return repo.startswith(prefix) and len(repo) > len(prefix)
    return repo.startswith(prefix) and "/" not in repo[len(prefix) :]


def check(spec: Mapping[str, Any], policy: SparkPolicy) -> None:
    """Refuse a run whose service account, image or ``sparkConf`` the policy forbids.

    Raises:
        RunRefused: ``ServiceAccountNotAllowed``, ``ImageNotAllowed`` or
            ``SparkConfNotAllowed``, saying what and what is allowed.
    """
    account = str(spec.get("serviceAccountName", DEFAULT_SERVICE_ACCOUNT))
    if account == policy.operator_service_account or account not in policy.service_accounts:
        allowed = ", ".join(sorted(policy.service_accounts - {policy.operator_service_account}))
        raise RunRefused(
            "ServiceAccountNotAllowed",
            f"serviceAccountName {account!r} is not allowed: the operator creates the run's "
            f"pod, and runs it only as {allowed or 'no account'} (--spark-service-account)",
        )
    image = str(spec.get("image", ""))
    if not any(image_allowed(image, p) for p in policy.image_prefixes):
        raise RunRefused(
            "ImageNotAllowed",
            f"image {image!r} is not under an allowed prefix: "
            f"{', '.join(policy.image_prefixes) or 'none'} (--spark-image-prefix)",
        )
    denied = sorted(
        key
        for key in (spec.get("sparkConf") or {})
        if any(fnmatch.fnmatchcase(str(key).lower(), p.lower()) for p in policy.denied_conf)
    )
    if denied:
        raise RunRefused(
            "SparkConfNotAllowed",
            f"sparkConf {', '.join(denied)}: a run may not change what code runs, the pods' "
            'image, volumes or identity (docs/kubernetes.md, "Spark in the cluster")',
        )
