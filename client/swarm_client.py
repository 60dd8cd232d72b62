"""`SwarmClient`: the client's window on the swarm: DHT node, P2P streams, view, bans, routes.

All async methods run on the client's `LoopThread`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Collection, Coroutine
from typing import Any

from client.config import ClientConfig
from client.loop import LoopThread
from client.measured import MeasuredThroughput
from routing import BanList, NoRouteError, RouteCosts, choose_route
from swarm.auth import SwarmKey
from swarm.codec import Limits
from swarm.connection import PeerStream, answers, open_stream
from swarm.dht import SwarmNode
from swarm.errors import PeerUnreachable
from swarm.notices import notice_recipients, tell
from swarm.schema import CrashNotice, Info, InfoReply, parse_reply
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
        self.distrusted: set[str] = set()  # peers caught returning wrong results: never used again
        self.measured = MeasuredThroughput()  # what peers really delivered to us (client/measured.py)
        self.route_rng = random.Random()  # which of the parallel routes a busy swarm's session takes
        self._background: set[asyncio.Task[None]] = set()  # re-dials and suspect reports (kept from the GC)
        self._view: SwarmView | None = None
        self._view_time = 0.0
        self.swarm_key = SwarmKey.load(config.swarm_key) if config.swarm_key else None
        self.node = SwarmNode(initial_peers=list(config.initial_peers), client_mode=True, swarm_key=self.swarm_key)
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

    async def plan(self, start: int, end: int, pages_needed: int = 0, fresh: bool = False,
                   exclude: Collection[str] = ()) -> Route:
        """A route over layers [start, end); a stale view gets one fresh re-read.

        The fastest route while its peers have room; in a busy swarm one drawn in proportion to
        the peers' spare capacity, so sessions spread over parallel routes (routing.choose_route).
        A peer's throughput is the smaller of what it announces and what this client measured.
        """
        try:
            view = self.measured.apply(await self.view(fresh))  # no peer is faster than we measured it
            announced = {peer_id: r.updated for peer_id, r in view.records.items()}
            return choose_route(view, self.route_rng, start=start, end=end, costs=self.costs,
                              banned=self.bans.penalties(time.monotonic(), announced), pages_needed=pages_needed,
                              exclude=set(exclude) | self.distrusted | self._too_coarse(view))
        except NoRouteError as e:
            if fresh:
                if self._too_coarse(self._view):
                    e.args = (f"{e.args[0]} (peers quantized below min_quant={self.config.min_quant} are not used)",)
                if not self._view.records and self.swarm_key is None:
                    e.args = (f"{e.args[0]} (no peer of {self.model_name} is visible at all: check the model "
                              "name and initial peers; a private swarm also needs swarm_key=FILE)",)
                raise
            return await self.plan(start, end, pages_needed, fresh=True, exclude=exclude)

    def _too_coarse(self, view: SwarmView) -> set[str]:
        """Peers whose announced quantization is below the client's `min_quant`."""
        return {pid for pid, r in view.records.items() if not self.config.accepts_quant(r.quant)}

    async def open_stream(self, peer_id: str) -> PeerStream:
        """A protocol stream to `peer_id` (authenticated in a private swarm)."""
        return await open_stream(self.p2p, peer_id, self.limits, swarm_key=self.swarm_key,
                                 timeout=self.config.connect_timeout)

    async def peer_info(self, peer_id: str) -> dict[str, Any]:
        """A peer's `info` reply: its live record and its serving counters."""
        stream = await self.open_stream(peer_id)
        try:
            reply = await stream.request(Info().to_wire(), self.config.step_timeout)
        finally:
            await stream.close()
        parse_reply(reply, self.limits, InfoReply)  # a record map and a stats map, or ProtocolError
        return reply

    async def distrust(self, peer_id: str, reason: str) -> None:
        """Never use `peer_id` again in this client, and report it on the DHT for the monitor."""
        self.distrusted.add(peer_id)
        logger.warning("peer %s returned wrong results (%s): no longer used; reported", peer_id, reason)
        try:
            await self.node.report_async(self.model_name, peer_id, reason)
        except Exception as e:
            logger.info("could not store the report on the DHT: %s", e)

    def ban(self, peer_id: str, cause: BaseException | None = None) -> None:
        """Avoid `peer_id` for a while; one we cannot dial at all, until it announces again.

        A stream that broke or timed out says little by itself (the peer may be overloaded, or
        moving), so the peer is asked for its `info` beside the failover: a crash shows as no answer.
        """
        seconds = self.bans.ban(peer_id, time.monotonic())
        logger.info("avoiding peer %s for %.0f s", peer_id, seconds)
        record = self._view.records.get(peer_id) if self._view is not None else None
        if record is None:
            return
        if isinstance(cause, PeerUnreachable):
            self._unreachable(peer_id, record.updated)
        elif isinstance(cause, (ConnectionError, OSError)):  # broken streams and timeouts
            self._beside(self._ask_if_alive(peer_id, record.updated))

    def _unreachable(self, peer_id: str, announced: float) -> None:
        logger.info("peer %s does not answer: avoiding it until it announces again", peer_id)
        if self.bans.unreachable(peer_id, announced):  # news: tell the peers (once per announcement)
            self._beside(self._report_unreachable(peer_id, announced))

    async def is_alive(self, peer_id: str, timeout: float | None = None) -> bool:
        """Does `peer_id` answer an info request within `timeout` s (default ClientConfig.stall_probe_s;
        client/stall.py)?"""
        return await answers(self.p2p, peer_id, self.limits, self.swarm_key,
                             self.config.stall_probe_s if timeout is None else timeout)

    async def _ask_if_alive(self, peer_id: str, announced: float) -> None:
        if not await answers(self.p2p, peer_id, self.limits, self.swarm_key, self.config.connect_timeout):
            self._unreachable(peer_id, announced)

    async def _report_unreachable(self, peer_id: str, announced: float) -> None:
        """Tell a few peers at once that `peer_id` does not answer (they tell more: swarm/notices.py), and
        suspect it on the DHT: self-placing peers probe it and, if it is gone, take over its layers
        before its record expires (peer/crash_watch.py)."""
        self._beside(self._tell_peers(peer_id, announced))  # at once, beside the DHT store
        try:
            await self.node.report_unreachable_async(self.model_name, peer_id, announced)
        except Exception as e:
            logger.info("could not report peer %s as unreachable: %s", peer_id, e)

    async def _tell_peers(self, peer_id: str, announced: float) -> None:
        if self._view is None:
            return
        recipients = notice_recipients(self._view, peer_id, (), self.route_rng)
        told = await tell(self.p2p, recipients, CrashNotice(peer_id, announced), self.limits, self.swarm_key)
        logger.info("told %d of %d peers that %s does not answer", told, len(recipients), peer_id)

    def _beside(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` on the client's loop without delaying the failover (kept referenced until done)."""
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def close(self) -> None:
        try:
            self.loop.run(self.p2p.shutdown(), timeout=5)
        except Exception:
            pass
        self.node.shutdown()
