"""What a secured cluster's Secrets are called, and the DNS names its servers'
certificates cover.

One place for both, because three parties must agree on them: the renderers mount the
Secrets by these names (:mod:`.secureservers`), the operator issues and renews them
(:mod:`.credentials`) or has cert-manager do it (:mod:`.certmanager`), and the servers are
reached at the names their certificates cover (a Service's names, the brokers' pod names
through the headless Service, a coordinator's pod DNS name). Pure string functions.
"""

from __future__ import annotations


def ca_secret(cluster: str) -> str:
    """The cluster CA (``tls.crt``, ``tls.key``, ``ca.crt``); never mounted."""
    return f"{cluster}-ca"


def broker_tls_secret(cluster: str) -> str:
    return f"{cluster}-broker-tls"


def coordinator_tls_secret(coordinator: str) -> str:
    """The certificate of a TransactionCoordinator's coordinators."""
    return f"{coordinator}-coordinator-tls"


def signer_secret(cluster: str) -> str:
    """The token signing key (``private.pem``); the operator's alone, never mounted."""
    return f"{cluster}-token-signer"


def auth_secret(cluster: str) -> str:
    """What the servers mount: ``public.pem`` (tokens' check) and ``cluster.jwt``."""
    return f"{cluster}-auth"


def token_secret(cluster: str, role: str) -> str:
    """A role's token (``token``) and the CA to verify the servers with (``ca.crt``)."""
    return f"{cluster}-token-{role}"


def broker_dns_names(cluster: str, namespace: str) -> list[str]:
    """The brokers' certificate names: their Service, each pod through the headless
    Service (``*.`` covers one label: the pod name), and ``localhost`` for
    ``kubectl port-forward``."""
    client, headless = f"{cluster}-broker", f"{cluster}-broker-headless"
    return [
        *_service_names(client, namespace),
        f"*.{headless}.{namespace}.svc",
        f"*.{headless}.{namespace}.svc.cluster.local",
        *_service_names(headless, namespace),
        "localhost",
    ]


def coordinator_dns_names(coordinator: str, namespace: str) -> list[str]:
    """A TransactionCoordinator's certificate names: its Service, and its pods' DNS names
    (``<ip with dashes>.<namespace>.pod``: a Deployment's pods have no other stable
    name; :func:`pod_dns_domain`), and ``localhost``."""
    return [
        *_service_names(f"{coordinator}-coordinator", namespace),
        f"*.{pod_dns_domain(namespace)}",
        f"*.{pod_dns_domain(namespace)}.cluster.local",
        "localhost",
    ]


def pod_dns_domain(namespace: str) -> str:
    """Where Kubernetes' DNS names pods by their address (``10-1-2-3.<ns>.pod``)."""
    return f"{namespace}.pod"


def _service_names(service: str, namespace: str) -> list[str]:
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]
