"""How a caller presents its credentials and checks the server: ``Authorization: Bearer
<token>`` on every request and WebSocket upgrade, and TLS that verifies the server's
certificate (docs/security.md). Shared by the client and by servers calling each other as
the cluster role, so that both do it the same way."""

from __future__ import annotations

import ssl
from pathlib import Path

from aiohttp import (
    ClientHandlerType,
    ClientMiddlewareType,
    ClientRequest,
    ClientResponse,
    hdrs,
)

from segtxn.protocol.tokens import TokenSource, token_source

BEARER = "Bearer"


def bearer_middleware(token: str | TokenSource) -> ClientMiddlewareType:
    """An aiohttp client middleware that puts ``Authorization: Bearer <token>`` on every
    request of a session, WebSocket upgrades included, and on each hop of a redirect
    (aiohttp drops the header when a redirect leaves the origin: a ``NotOwner`` 307 leads to
    another broker of the same cluster, which needs it too). A request that already carries
    the header keeps it (a server relaying its caller's request sends the caller's
    credentials, not its own). With a :class:`~segtxn.protocol.tokens.TokenSource`, each
    request asks it for the token (a refreshed one once the old one nears its expiry).

    Raises:
        ValueError: a fixed token that is empty, or has characters a header cannot hold.
        segtxn.protocol.tokens.TokenUnavailable: (from a request) the source has no token.
    """
    source = token_source(token) if isinstance(token, str) else token

    async def middleware(request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        if hdrs.AUTHORIZATION not in request.headers:
            request.headers[hdrs.AUTHORIZATION] = f"{BEARER} {await source.get()}"
        return await handler(request)

    return middleware


def ssl_reason(e: BaseException) -> str:
    """The short reason of an ``ssl``/OS error (``certificate has expired``, ``No such file
    or directory``), else its text."""
    reason = getattr(e, "verify_message", None) or getattr(e, "reason", None)
    return str(reason or getattr(e, "strerror", None) or e)


def load_pair(context: ssl.SSLContext, cert_file: Path, key_file: Path) -> None:
    """Load a certificate chain and its key into ``context``.

    Raises:
        ValueError: either file cannot be read, or they are not a certificate and its key.
    """
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(
            f"{cert_file} / {key_file}: not a certificate and its key ({ssl_reason(e)})"
        ) from e


def client_ssl_context(
    ca_file: Path | None = None, cert_file: Path | None = None, key_file: Path | None = None
) -> ssl.SSLContext:
    """A TLS context that verifies servers: their certificates against ``ca_file`` (default:
    the system's CAs) and their host names; with ``cert_file`` (and ``key_file``, default
    the same file), a certificate to present to servers that ask for one.

    Raises:
        ValueError: a file that cannot be loaded (it names the file).
    """
    try:
        context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"{ca_file}: not a CA certificate file ({ssl_reason(e)})") from e
    if cert_file is not None:
        load_pair(context, cert_file, key_file or cert_file)
    return context
