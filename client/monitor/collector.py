"""`Collector`: the monitor's only network code: reads the DHT and asks every peer for `info`.

It runs on the aiohttp event loop. Each refresh reads the model registry and every model's
view, then probes all peers at once (asyncio.gather, each with its own timeout), and swaps in
a new state dict. HTTP handlers only read `collector.state`, so a page load never waits on the
network and a slow peer never slows the page. When the DHT cannot be read, the previous state
stays in place, marked stale with the error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any, Protocol

from client.monitor.state import Probe, build_state, mark_failed
from swarm.types import SwarmView

logger = logging.getLogger(__name__)

ProbeFn = Callable[[str], Awaitable[Probe]]


class DhtReader(Protocol):
    """What the collector needs from `swarm.dht.SwarmNode` (tests pass a fake)."""

    async def list_models_async(self) -> dict[str, int]: ...

    async def fetch_view_async(self, model: str, num_layers: int | None = None) -> SwarmView: ...


def describe(error: BaseException) -> str:
    """A one-line reason for the page; timeouts have an empty str() in asyncio."""
    if isinstance(error, asyncio.TimeoutError):
        return "timed out"
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200]}" if text else type(error).__name__


async def probe_info(p2p: Any, peer_id: str, timeout: float, swarm_key: Any = None) -> Probe:
    """Ask one peer for `info` over a fresh stream; never raises (a failure is a Probe too)."""
    from swarm.codec import Limits
    from swarm.connection import open_stream
    from swarm.errors import ProtocolError
    from swarm.schema import Info, InfoReply, parse_reply

    stream = None
    deadline = time.monotonic() + timeout  # one budget for dial + request: a refresh waits at most this
    try:
        stream = await asyncio.wait_for(open_stream(p2p, peer_id, Limits(), swarm_key=swarm_key), timeout)
        # Time only the request on an open stream: dialing is a one-off cost, not the link's RTT.
        start = time.perf_counter()
        reply = await stream.request(Info().to_wire(), max(0.01, deadline - time.monotonic()))
        rtt = time.perf_counter() - start
        try:
            info = parse_reply(reply, stream.limits, InfoReply)
        except ProtocolError as e:
            return Probe(peer_id, False, rtt, f"bad info reply: {e.message}", None, time.time())
        # record and stats are still untrusted: the state builder range-checks and sanitises them
        return Probe(peer_id, True, rtt, None, {"record": info.record, "stats": info.stats}, time.time())
    except Exception as e:  # unreachable peers are the normal case for a monitor, not a crash
        return Probe(peer_id, False, None, describe(e), None, time.time())
    finally:
        if stream is not None:
            with suppress(Exception):
                await asyncio.wait_for(stream.close(), 1.0)


class Collector:
    def __init__(self, node: DhtReader, probe: ProbeFn, refresh: float, dht_timeout: float) -> None:
        self.node = node
        self.probe = probe
        self.refresh = refresh
        self.dht_timeout = dht_timeout
        self.state: dict[str, Any] = build_state([], {}, None, refresh)
        self.probes: dict[str, Probe] = {}  # last answer per peer, kept between refreshes
        self.refreshes = 0
        self.failures = 0

    async def read_views(self) -> list[SwarmView]:
        models = await asyncio.wait_for(self.node.list_models_async(), self.dht_timeout)
        return list(
            await asyncio.wait_for(
                asyncio.gather(*(self.node.fetch_view_async(m, n) for m, n in models.items())),
                self.dht_timeout,
            )
        )

    async def read_reports(self, model: str) -> dict[str, int]:
        """peer id -> clients that reported it for wrong results; {} when unreadable (a detail, not health)."""
        fetch = getattr(self.node, "fetch_reports_async", None)
        if fetch is None:
            return {}
        try:
            found = await asyncio.wait_for(fetch(model), self.dht_timeout)
        except Exception as e:
            logger.debug("reading reports of %s failed: %s", model, describe(e))
            return {}
        return {peer_id: len(entries) for peer_id, entries in found.items()}

    async def refresh_once(self) -> dict[str, Any]:
        try:
            views = await self.read_views()
        except Exception as e:
            self.failures += 1
            logger.warning("reading the DHT failed (%s); serving the last state, marked stale", describe(e))
            self.state = mark_failed(self.state, f"DHT unreachable: {describe(e)}")
            return self.state
        peer_ids = sorted({pid for view in views for pid in view.records})
        results = await asyncio.gather(*(self.probe(pid) for pid in peer_ids))
        # Forget peers that left the DHT; keep the rest so a later failed refresh still has them.
        self.probes = {p.peer_id: p for p in results}
        reports = {view.model: await self.read_reports(view.model) for view in views}
        self.state = build_state(views, self.probes, time.time(), self.refresh, reports=reports)
        self.refreshes += 1
        return self.state

    async def run(self) -> None:
        """Refresh forever, every `refresh` seconds (measured start to start)."""
        while True:
            started = time.monotonic()
            try:
                await self.refresh_once()
            except Exception:  # a bug in state building must not stop the page from updating later
                logger.exception("refresh failed")
            await asyncio.sleep(max(0.0, self.refresh - (time.monotonic() - started)))
