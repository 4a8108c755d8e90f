"""Client-side errors. Server errors arrive as :class:`segtxn.protocol.errors.ServerError`
(branch on ``.name``); these are the ones the client raises itself."""

from __future__ import annotations


class ClientError(Exception):
    """Base of the client's own errors."""


class ClientClosed(ClientError):
    """The client, producer or consumer was closed."""


class MessageTooLarge(ClientError):
    """A payload larger than the broker accepts (checked before sending)."""


class Timeout(ClientError):
    """An operation did not complete in time (the broker may still complete it)."""


class TopicEnded(ClientError):
    """A reader has received everything: its topic is sealed, or it passed its ``end``."""
