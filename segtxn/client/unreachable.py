"""A connection that could not be made: told apart from a server's answer
(:func:`cannot_reach`), and in words (``connection refused``, ``the host name does not
resolve``) for the client's errors and the command line's alike: aiohttp's repr of one
(``ClientConnectorError(ConnectionKey(host=..., proxy_headers_hash=None, ...), ...)``)
tells a user nothing they can act on."""

from __future__ import annotations

import errno
import os
import socket

import aiohttp

from segtxn.protocol.errors import ServiceNotReady


def why_unreachable(e: BaseException) -> str:
    """A connection failure in words."""
    if isinstance(e, aiohttp.ClientConnectorDNSError | socket.gaierror) or isinstance(
        getattr(e, "os_error", None), socket.gaierror
    ):
        return "the host name does not resolve"
    if isinstance(e, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError):
        return "its TLS certificate was refused"
    os_error = getattr(e, "os_error", e)
    code = getattr(os_error, "errno", None)
    if code == errno.ECONNREFUSED:
        return "connection refused"
    if isinstance(code, int) and code > 0:
        return os.strerror(code).lower()
    if isinstance(e, aiohttp.ServerDisconnectedError | aiohttp.ClientConnectionResetError):
        return "the server closed the connection"
    if isinstance(e, TimeoutError):
        return "no answer in time"
    return str(e) or type(e).__name__


def cannot_reach(error: BaseException) -> bool:
    """``error`` says a server could not be reached (refused, reset, no answer in time), as
    opposed to what a server answered: a ServiceNotReady the client made from a transport
    error (raised ``from`` it), or that error itself."""
    if isinstance(error, ServiceNotReady):
        error = error.__cause__ or error
    return isinstance(error, aiohttp.ClientConnectionError | OSError | TimeoutError)
