"""A client certificate's subject as its role: mutual-TLS authentication without a token.

A server that requires client certificates (``--tls-client-ca``) may also take the role from
the certificate a client presented, when the request carries no ``Authorization`` header
(a token, when given, wins: it is the more specific credential, and an application may hold
a certificate for the transport and a token per tenant). Which part of the certificate
names the role is a setting, :class:`CertRole`: the subject's common name, or the first URI
(a SPIFFE id, say) or e-mail address among its subject alternative names.

The certificate has already been verified against the client CA by the TLS handshake (the
listener's context requires it); this module only reads the verified certificate that
``ssl`` hands back. It expires like a token: a WebSocket opened with it is closed at its
``notAfter`` (:func:`segtxn.auth.guard.close_at_expiry`).
"""

from __future__ import annotations

import enum
import ssl
from typing import Any

from segtxn.protocol.errors import ErrorName, ServerError


class CertRole(enum.StrEnum):
    """Which part of a client certificate names its role."""

    CN = "cn"
    """The subject's common name."""
    URI = "uri"
    """The first URI subject alternative name (``spiffe://cluster/ns/app``)."""
    EMAIL = "email"
    """The first e-mail (rfc822Name) subject alternative name."""


_SAN_TYPE = {CertRole.URI: "URI", CertRole.EMAIL: "email"}
_WHAT = {
    CertRole.CN: "subject common name",
    CertRole.URI: "URI subject alternative name",
    CertRole.EMAIL: "e-mail subject alternative name",
}


def _unauthenticated(message: str) -> ServerError:
    return ServerError(ErrorName.UNAUTHENTICATED, message)


def certificate_role(peer: dict[str, Any] | None, source: CertRole) -> tuple[str, float]:
    """The role a verified client certificate names (its ``source`` part) and when the
    certificate expires (epoch seconds). ``peer`` is ``SSLSocket.getpeercert()``'s
    dictionary (None or empty: no verified certificate).

    Raises:
        ServerError(Unauthenticated): no certificate, or it has no such part.
    """
    if not peer:
        raise _unauthenticated(
            "no credentials: send 'Authorization: Bearer <token>' or a client certificate"
        )
    if source is CertRole.CN:
        values = [
            value for rdn in peer.get("subject", ()) for key, value in rdn if key == "commonName"
        ]
    else:
        values = [
            value for kind, value in peer.get("subjectAltName", ()) if kind == _SAN_TYPE[source]
        ]
    role = values[0] if values else ""
    if not role or role != role.strip():
        raise _unauthenticated(
            f"the client certificate has no usable {_WHAT[source]} to name a role "
            f"(the server takes roles from certificates' {source.value})"
        )
    try:
        expires_s = float(ssl.cert_time_to_seconds(peer["notAfter"]))
    except (KeyError, ValueError) as e:
        raise _unauthenticated(f"the client certificate's expiry cannot be read: {e}") from e
    return role, expires_s
