"""The brokers' admin endpoints the operator's roll and scale-down call, faked: a small
aiohttp app on a free port holding which broker homes what, and recording the drains.

Faked, not real broker processes: the roll's tests need brokers whose pods the test
deletes and recreates under kmock (no kubelet runs them), and a drain that can be made to
fail on demand. The real endpoints are tested with real brokers in
``tests/broker/test_takeover.py``; this app answers as they do (the same paths and JSON
shapes, NotAllowed without replication)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class FakeBrokers:
    homes: dict[str, list[str]]
    """Broker id -> the topics homed on it."""
    stuck: set[str] = field(default_factory=set)
    """Brokers whose drain moves nothing (each home fails to move)."""
    replicated: bool = True
    """False: a drain answers NotAllowed, as a broker without ``--replication``."""
    log: list[tuple[str, str]] = field(default_factory=list)
    """("drain" | "undrain", broker), in order; tests add their own entries too."""
    draining: set[str] = field(default_factory=set)
    unregistered: set[str] = field(default_factory=set)
    """Brokers not registered (gone, or not up yet): a drain answers 404 InvalidArgument
    and the homes say ``registered: false``, as a real broker does."""
    before_drain: Callable[[str], None] | None = None
    """Called with the broker before each drain (a test's invariant check)."""
    url: str = ""

    def _drain(self, broker: str) -> dict[str, object]:
        if self.before_drain is not None:
            self.before_drain(broker)
        self.log.append(("drain", broker))
        self.draining.add(broker)
        held = self.homes.get(broker, [])
        if broker in self.stuck:
            return {"broker": broker, "moved": [], "failed": dict.fromkeys(held, "injected")}
        takers = sorted(b for b in self.homes if b != broker and b not in self.draining)
        for i, topic in enumerate(held):
            self.homes[takers[i % len(takers)]].append(topic)
        self.homes[broker] = []
        return {"broker": broker, "moved": held, "failed": {}}

    async def homes_of(self, request: web.Request) -> web.Response:
        broker = request.match_info["broker"]
        limit = int(request.query.get("limit", "100"))
        held = self.homes.get(broker, [])
        more = len(held) > limit
        registered = broker not in self.unregistered
        return web.json_response(
            {"broker": broker, "homes": held[:limit], "more": more, "registered": registered}
        )

    async def drain(self, request: web.Request) -> web.Response:
        broker = request.match_info["broker"]
        if broker in self.unregistered:
            self.log.append(("unregistered", broker))
            message = f"no broker {broker} is registered"
            return web.json_response({"error": "InvalidArgument", "message": message}, status=404)
        if request.method == "DELETE":
            self.log.append(("undrain", broker))
            self.draining.discard(broker)
            return web.json_response({"broker": broker, "draining": False})
        if not self.replicated:
            body = {"error": "NotAllowed", "message": f"broker {broker} has no --replication"}
            return web.json_response(body, status=405)
        return web.json_response(self._drain(broker))


@contextlib.asynccontextmanager
async def serving(brokers: FakeBrokers) -> AsyncIterator[FakeBrokers]:
    """``brokers`` answering on 127.0.0.1 at a free port (``brokers.url``)."""
    app = web.Application()
    app.router.add_get("/admin/v2/brokers/{broker}/homes", brokers.homes_of)
    app.router.add_post("/admin/v2/brokers/{broker}/drain", brokers.drain)
    app.router.add_delete("/admin/v2/brokers/{broker}/drain", brokers.drain)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    brokers.url = f"http://127.0.0.1:{port}"
    try:
        yield brokers
    finally:
        await runner.cleanup()
