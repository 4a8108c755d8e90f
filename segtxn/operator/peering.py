"""Kopf's peering object, looked for once at start-up.

With a peering name (``segtxn operator --peering``, on unless ``--standalone``) Kopf keeps
every watch paused until a peering object of that name exists: a ``KopfPeering`` in each
watched namespace, or the ``ClusterKopfPeering`` when every namespace is watched. Kopf says
so only at DEBUG, so an operator without the object looks healthy (Running, its liveness
probe passing) and handles nothing. :func:`warn_if_missing` reads the objects once and
logs a WARNING for each one missing, saying how to create it. It neither waits nor
fails: the object may be created later, and Kopf then resumes the watches by itself.
The chart creates the objects (``templates/peering.yaml``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import aiohttp

from segtxn.operator.kube import Kube, KubeError

log = logging.getLogger(__name__)


async def missing(kube: Kube, name: str, namespaces: Sequence[str] | None) -> list[str | None]:
    """Where the peering object ``name`` does not exist: each of ``namespaces`` without
    its KopfPeering, or ``[None]`` when ``namespaces`` is None (every namespace watched)
    and the ClusterKopfPeering does not exist.

    Raises:
        KubeError: the API server refused or failed a read.
    """
    scopes: Sequence[str | None] = [None] if namespaces is None else namespaces
    return [scope for scope in scopes if await kube.get_peering(name, scope) is None]


async def warn_if_missing(kube: Kube, name: str, namespaces: Sequence[str] | None) -> None:
    """Log a WARNING for each peering object :func:`missing` finds missing, or for a read
    that failed (then nothing is known; start-up goes on either way)."""
    try:
        gone = await missing(kube, name, namespaces)
    except (KubeError, aiohttp.ClientError) as e:
        log.warning(
            "Cannot check that Kopf's peering object %r exists (%s): without it the "
            "operator handles nothing.",
            name,
            e,
        )
        return
    for namespace in gone:
        if namespace is None:
            where, kind, create = "", "ClusterKopfPeering", "kubectl apply -f -"
        else:
            where, kind = f" in namespace {namespace!r}", "KopfPeering"
            create = f"kubectl -n {namespace} apply -f -"
        log.warning(
            "%s %r does not exist%s: Kopf keeps the watches paused until it does, so "
            "nothing%s is handled. The chart creates it; by hand: `%s` of "
            "{apiVersion: kopf.dev/v1, kind: %s, metadata: {name: %s}}; or run a single "
            "replica with --standalone.",
            kind,
            name,
            where,
            " there" if namespace else "",
            create,
            kind,
            name,
        )
