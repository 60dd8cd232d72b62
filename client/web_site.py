"""Where swarm-api and swarm-monitor listen: their aiohttp app's site started on host:port."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiohttp import web


async def start_site(runner: web.AppRunner, host: str, port: int) -> str:
    """Serve `runner` (set up) on host:port; the URL it listens at, with the real port when `port` is 0."""
    from aiohttp import web

    site = web.TCPSite(runner, host, port)
    await site.start()
    sockets = getattr(site._server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    shown = f"[{host}]" if ":" in host else host  # an IPv6 literal
    return f"http://{shown}:{bound}/"
