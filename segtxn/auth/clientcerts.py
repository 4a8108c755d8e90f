"""Client certificates required on every route but the open ones (``--tls-client-ca``).

A server given a client CA asks every client for a certificate in the TLS handshake and
refuses one that does not verify against that CA (``ssl.CERT_OPTIONAL``: the handshake
fails on a bad certificate). A client that presents *none* completes the handshake; this
middleware then refuses each of its requests, unless the route is open to everyone
(:data:`segtxn.auth.endpoints.Kind.OPEN`: ``/healthz`` and ``/readyz``, and ``/metrics``
unless protected), with 401 ``Unauthenticated`` saying a client certificate is required.

Why not refuse the handshake itself (``CERT_REQUIRED``): the kubelet's HTTPS probes
present no certificate, so a server requiring one at the TLS layer is never Ready on
Kubernetes; and with TLS 1.3 a refused handshake reaches the client only as a dropped
connection after it believed it was connected, which says nothing. The cost: a client
without a certificate gets as far as sending its request line and headers (bounded by
aiohttp's limits) before it is refused; it reaches no handler and no route but the
probes (docs/security.md, "TLS").
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Middleware

from segtxn.auth.endpoints import Kind, rule_for
from segtxn.boundary import Handler, error_response
from segtxn.protocol.errors import ErrorName, ServerError

REQUIRED = (
    "a client certificate is required: this server takes only clients that present one "
    "signed by its client CA (--tls-client-ca)"
)


def has_client_certificate(request: web.Request) -> bool:
    """Whether ``request``'s connection presented a certificate (which the handshake has
    verified against the client CA: a bad one never gets this far)."""
    transport = request.transport
    return bool(transport is not None and transport.get_extra_info("peercert"))


def client_certificates(protect_metrics: bool) -> Middleware:
    """The middleware refusing requests without a client certificate on every route but
    the open ones (``/metrics`` is one unless ``protect_metrics``)."""

    @web.middleware
    async def require_client_certificate(
        request: web.Request, handler: Handler
    ) -> web.StreamResponse:
        resource = request.match_info.route.resource
        if resource is not None and not has_client_certificate(request):
            rule = rule_for(request.method, resource.canonical, protect_metrics=protect_metrics)
            if rule.kind is not Kind.OPEN:
                return error_response(ServerError(ErrorName.UNAUTHENTICATED, REQUIRED), request)
        return await handler(request)

    return require_client_certificate
