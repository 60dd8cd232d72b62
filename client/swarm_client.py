"""`SwarmClient`: the client's window on the swarm: DHT node, P2P streams, view, bans, routes.

All async methods run on the client's `LoopThread`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from client.config import ClientConfig
from client.loop import LoopThread
from routing import BanList, NoRouteError, RouteCosts, plan_route
from swarm.codec import Limits
from swarm.dht import SwarmNode
from swarm.types import Route, SwarmView

logger = logging.getLogger(__name__)


class SwarmClient:
    def __init__(self, config: ClientConfig, model_name: str, num_layers: int, loop: LoopThread) -> None:
        self.config = config
        self.model_name = model_name
        self.num_layers = num_layers
        self.loop = loop
        self.limits = Limits()
        self.bans = BanList()
        self.costs = RouteCosts()
        self._view: SwarmView | None = None
        self._view_time = 0.0
        self.node = SwarmNode(initial_peers=list(config.initial_peers), client_mode=True)
        try:
            self.p2p: Any = loop.run(self.node.replicate_p2p(), timeout=config.connect_timeout)
        except BaseException:
            self.node.shutdown()
            raise

    async def view(self, fresh: bool = False) -> SwarmView:
        age = time.monotonic() - self._view_time
        if fresh or self._view is None or age > self.config.view_max_age:
            self._view = await self.node.fetch_view_async(self.model_name, self.num_layers)
            self._view_time = time.monotonic()
        return self._view

    async def plan(self, start: int, end: int, pages_needed: int = 0, fresh: bool = False) -> Route:
        """The fastest route over layers [start, end); a stale view gets one fresh re-read."""
        try:
            view = await self.view(fresh)
            return plan_route(view, start=start, end=end, costs=self.costs,
                              banned=self.bans.penalties(time.monotonic()), pages_needed=pages_needed)
        except NoRouteError:
            if fresh:
                raise
            return await self.plan(start, end, pages_needed, fresh=True)

    def ban(self, peer_id: str) -> None:
        seconds = self.bans.ban(peer_id, time.monotonic())
        logger.info("avoiding peer %s for %.0f s", peer_id, seconds)

    def close(self) -> None:
        try:
            self.loop.run(self.p2p.shutdown(), timeout=5)
        except Exception:
            pass
        self.node.shutdown()
