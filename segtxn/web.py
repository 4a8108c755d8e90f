"""Running an aiohttp application on a host and port: shared by brokers and coordinators."""

from __future__ import annotations

from urllib.parse import urlsplit

from aiohttp import web


class AppServer:
    """``start()`` serves ``app`` on ``host:port`` (defaults: the advertised URL's);
    ``stop()`` runs its shutdown and clean-up."""

    def __init__(
        self, app: web.Application, advertise_url: str, host: str | None, port: int | None
    ) -> None:
        parts = urlsplit(advertise_url)
        self.app = app
        self.host = host or parts.hostname or "127.0.0.1"
        self.port = port if port is not None else (parts.port or 80)
        self._runner = web.AppRunner(app, handle_signals=False)

    async def start(self) -> None:
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()

    async def stop(self) -> None:
        await self._runner.cleanup()
