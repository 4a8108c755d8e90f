"""How loudly a broker logs a topic's refused load: at WARNING the first time it refuses
a topic with an answer, at DEBUG while it goes on refusing it with the same one.

A refused load is answered to the client (``ServiceNotReady``, ``NotOwner``, ...), and a
client told to retry asks again, every few hundred milliseconds, for as long as the cause
lasts. A persistent topic marked ``deleting`` (:mod:`segtxn.broker.deletemark`) is
refused until somebody sends its ``DELETE`` again, which may be never: one WARNING per
retry flooded the broker's log with the same line, burying the others. One line says it;
the client's own log says each reconnection's refusal the same way
(``segtxn.client.stream``).

What was said is forgotten when the topic loads, or when its deletion is finished (a topic
made again under the name and refused again is said again at WARNING). At most
:data:`REMEMBERED` topics are remembered, the least recently refused forgotten first: a
topic forgotten is said at WARNING once more.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from segtxn.protocol.errors import ServerError
from segtxn.protocol.names import TopicName

REMEMBERED = 10_000
"""How many refused topics' last answers a broker remembers."""


class LoadRefusals:
    """The answer each topic's load was last refused with, said at WARNING (see the module
    docstring)."""

    def __init__(self) -> None:
        self._said: OrderedDict[TopicName, str] = OrderedDict()

    def level(self, name: TopicName, error: ServerError) -> int:
        """The level to log this refusal of ``name`` at: WARNING unless its last refusal
        gave the same answer (then DEBUG); remembers it."""
        again = self._said.get(name) == str(error)
        self._said[name] = str(error)
        self._said.move_to_end(name)
        if len(self._said) > REMEMBERED:
            self._said.popitem(last=False)
        return logging.DEBUG if again else logging.WARNING

    def forget(self, name: TopicName) -> None:
        """``name`` loaded, or its deletion finished: its next refusal is said at WARNING."""
        self._said.pop(name, None)
