"""Where ``segtxn broker``, ``coordinator`` and ``standalone`` listen, and the URL each
advertises (registers in the metadata store, prints on ``serving:``).

Port 0 asks the system for a free port. The URL naming it is made before the server is
(the servers' parts keep it from the start), so the port is bound first: a
:class:`~segtxn.web.Listener` is opened here, before anything starts, and the server serves
on that very socket. Nothing else can take the port meanwhile, as another process could
when the port was picked by binding a socket and closing it again (the server then failed
to start: address already in use). An advertised port 0 means the port listened on.
"""

from __future__ import annotations

import contextlib
from urllib.parse import urlsplit

import click

from segtxn.web import Listener, ListenFailed


def url_of(scheme: str, host: str, port: int) -> str:
    """``scheme://host:port``, an IPv6 address in brackets."""
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def with_port(url: str, port: int) -> str:
    """``url`` (``scheme://host[:port]``) naming ``port``."""
    parts = urlsplit(url)
    return url_of(parts.scheme, parts.hostname or "", port)


def listen_on_a_free_port(
    stack: contextlib.ExitStack, host: str, given: int | None = None
) -> Listener:
    """A :class:`Listener` on a port of ``host`` that the system picks, open until
    ``stack`` closes (or the server given it stops). ``given``: a port named for another
    server of this process, free until that server listens on it, so the system could hand
    it out too: it is held while another is picked.

    Raises:
        click.BadParameter: ``host`` is not an address this machine can listen on.
    """
    with contextlib.ExitStack() as passed_over:
        while True:
            try:
                listener = Listener(host, 0)
            except ListenFailed as e:
                raise click.BadParameter(
                    f"cannot listen on {host}: {e.reason}", param_hint="'--host'"
                ) from e
            if listener.port != given:
                return stack.enter_context(listener)
            passed_over.enter_context(listener)


def listen_as_advertised(
    stack: contextlib.ExitStack, host: str, port: int | None, advertise: str
) -> tuple[Listener | None, str]:
    """Where a server of ``--host``, ``--port`` (None: the advertised port) and
    ``--advertise`` listens, and the URL it advertises.

    On port 0 (``--port 0``, or an advertised port 0 without ``--port``): a listener on a
    port the system picks, open now (see :func:`listen_on_a_free_port`), and ``advertise``
    naming its port. Else None (the server binds its port as it starts), and ``advertise``
    naming ``--port`` if its own port is 0.

    Raises:
        click.BadParameter: ``--port 0`` with an advertised port other than 0, which
            cannot be the port picked; ``host`` cannot be listened on.
    """
    advertised = urlsplit(advertise).port
    listen = port if port is not None else advertised
    if listen != 0:
        return None, (with_port(advertise, listen) if advertised == 0 and listen else advertise)
    if advertised != 0:
        raise click.BadParameter(
            f"0 listens on a port the system picks, which --advertise {advertise} cannot "
            f"name in advance: advertise port 0 ({with_port(advertise, 0)}) to advertise "
            "the port picked",
            param_hint="'--port'",
        )
    listener = listen_on_a_free_port(stack, host)
    return listener, with_port(advertise, listener.port)
