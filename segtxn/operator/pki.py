"""The operator's certificate authority and token issuer, as pure functions of keys and time.

When a SegtxnCluster's security is on and its certificates are the operator's own
(:mod:`.security`), the operator keeps a private CA per cluster, issues the brokers' and
coordinators' server certificates from it, and signs the tokens of the cluster's roles
with an ES256 key whose public half the servers verify with. Everything here is PEM in,
PEM out, with the time given (``now``), so the tests can issue a certificate that is due
for renewal without waiting; the Secrets that hold the results are :mod:`.secrets`'s.

Keys are EC P-256 (ECDSA): small, fast to generate in a reconcile, accepted by every TLS
1.2+ client and by the servers' ES256 token check (segtxn/auth/tokens.py). The servers only
ever see the public half of the token key: a broker cannot mint tokens.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
"""A cluster CA's life: ten years (it is renewed like any certificate, but every server
and client that trusts it must then be given the new one: docs/security.md)."""
SKEW = datetime.timedelta(minutes=5)
"""Certificates and tokens are valid from this long before ``now``: clocks differ."""


class PkiError(ValueError):
    """Stored material that cannot be used (not PEM, not a certificate, a key that is not
    EC P-256): the Secret holding it was edited or damaged."""


@dataclass(frozen=True)
class Issued:
    """A certificate (PEM) and its private key (PEM, PKCS#8, unencrypted)."""

    cert_pem: bytes
    key_pem: bytes


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _load_key(pem: bytes) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as e:
        raise PkiError(f"not a PEM private key: {e}") from e
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PkiError(f"a {type(key).__name__}, not an EC private key")
    return key


def load_certificate(pem: bytes) -> x509.Certificate:
    """The first certificate of ``pem``.

    Raises:
        PkiError: not a PEM certificate.
    """
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError as e:
        raise PkiError(f"not a PEM certificate: {e}") from e


def new_ca(common_name: str, now: datetime.datetime, days: int = CA_DAYS) -> Issued:
    """A self-signed CA certificate (``basicConstraints: CA``, path length 0: it signs
    server certificates only) and its key."""
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - SKEW)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue_server(
    ca: Issued,
    common_name: str,
    dns_names: Sequence[str],
    now: datetime.datetime,
    days: int,
) -> Issued:
    """A server certificate for ``dns_names`` (its subject alternative names; a name may
    start with ``*.``, which covers one label) signed by ``ca``, and its new key. It is
    good for TLS servers and clients both (extended key usage), since servers present it
    when they call each other.

    Raises:
        PkiError: ``ca`` cannot be loaded.
    """
    ca_cert, ca_key = load_certificate(ca.cert_pem), _load_key(ca.key_pem)
    key = _key()
    sans: list[x509.GeneralName] = []
    for name in dns_names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - SKEW)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue_client(ca: Issued, role: str, now: datetime.datetime, days: int) -> Issued:
    """A client certificate naming ``role`` (its subject's common name, which a server
    with ``--auth-cert-role cn`` takes as the role) signed by ``ca``, and its new key: what
    a caller presents to servers that require client certificates (mutual TLS).

    Raises:
        PkiError: ``ca`` cannot be loaded.
    """
    ca_cert, ca_key = load_certificate(ca.cert_pem), _load_key(ca.key_pem)
    key = _key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, role)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - SKEW)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def common_name_of(cert_pem: bytes) -> str | None:
    """A certificate's subject common name (None without one)."""
    names = load_certificate(cert_pem).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else None


def dns_names_of(cert_pem: bytes) -> list[str]:
    """The DNS and IP subject alternative names of a certificate, as text."""
    try:
        ext = load_certificate(cert_pem).extensions.get_extension_for_class(
            x509.SubjectAlternativeName
        )
    except x509.ExtensionNotFound:
        return []
    names = ext.value.get_values_for_type(x509.DNSName)
    ips = [str(ip) for ip in ext.value.get_values_for_type(x509.IPAddress)]
    return [*names, *ips]


def expires(cert_pem: bytes) -> datetime.datetime:
    """When a certificate stops being valid (UTC)."""
    return load_certificate(cert_pem).not_valid_after_utc


def signed_by(cert_pem: bytes, ca_pem: bytes) -> bool:
    """Whether ``cert_pem`` was issued by (and verifies with) the CA in ``ca_pem``."""
    try:
        load_certificate(cert_pem).verify_directly_issued_by(load_certificate(ca_pem))
    except (ValueError, TypeError, PkiError):
        return False
    return True


# ---------------------------------------------------------------------- tokens


def new_signing_key() -> bytes:
    """A new ES256 token signing key (PEM, PKCS#8)."""
    return _key_pem(_key())


def public_key_pem(signing_key_pem: bytes) -> bytes:
    """The PEM public half of a signing key: what the servers verify tokens with
    (``--auth-public-key``)."""
    return (
        _load_key(signing_key_pem)
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def mint_token(signing_key_pem: bytes, role: str, now: datetime.datetime, days: int) -> str:
    """A token (JWT, ES256) naming ``role`` (``sub``), valid ``days`` from ``now``."""
    claims = {
        "sub": role,
        "iat": int((now - SKEW).timestamp()),
        "exp": int((now + datetime.timedelta(days=days)).timestamp()),
        "iss": "segtxn-operator",
    }
    return jwt.encode(claims, _load_key(signing_key_pem), algorithm="ES256")


def token_expires(token: str) -> datetime.datetime | None:
    """A token's ``exp`` (not verified: the operator reads its own tokens back), or None
    when it cannot be read."""
    try:
        exp: Any = jwt.decode(token, options={"verify_signature": False}).get("exp")
        return datetime.datetime.fromtimestamp(float(exp), datetime.UTC)
    except (jwt.InvalidTokenError, TypeError, ValueError, OverflowError):
        return None


def token_verifies(token: str, signing_key_pem: bytes) -> bool:
    """Whether ``token`` is signed with ``signing_key_pem`` (expiry not checked)."""
    try:
        public = _load_key(signing_key_pem).public_key()
        jwt.decode(token, public, algorithms=["ES256"], options={"verify_exp": False})
    except (jwt.InvalidTokenError, PkiError):
        return False
    return True
