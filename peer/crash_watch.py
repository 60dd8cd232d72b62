"""CrashWatch: drop from the balancer's view the peers that clients could not dial and we cannot either.

A crashed peer's record outlives it by up to its TTL (30 s). Until the record expires, balancing
counts the dead peer, and nobody takes over its layers even when it was their only server. Clients
notice first: a dial that fails outright makes the client report the peer as a suspect on the DHT
(swarm.dht.report_unreachable_async). A report is only a claim; a hostile client could accuse live
peers. So each self-placing peer probes each suspect itself, once per announcement of it, and a
bounded number per read. It drops the record only when its own probe fails too. The peer's
balancing then sees the layers uncovered and reacts at once (routing.urgent_layers), as it would
after the record expired. The client also tells a few peers directly (peer/crash_notices.py): those
suspects are screened the same way, and a peer whose probe finds one dead tells a few more.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace

from swarm.types import SwarmView

logger = logging.getLogger(__name__)

# Probes per view read (run at once): a flood of forged suspects costs each peer at most this many probes
# per watch period (peer/config.py WATCH_PERIOD_S). 4 exceeds the crashes a swarm sees at once.
MAX_PROBES_PER_READ = 4
# Verdicts remembered (per peer id and announcement); older ones go first. A verdict is only
# needed while the announcement it is about is still in the view.
MAX_VERDICTS = 1024


class CrashWatch:
    """`screen(view)`: `view` minus the suspects this peer also failed to reach (see the module docstring)."""

    def __init__(self, fetch_suspects: Callable[[], Awaitable[dict[str, float]]],
                 probe: Callable[[str], Awaitable[bool]], me: Callable[[], str],
                 heard: Callable[[], dict[str, float]] = dict,
                 on_dead: Callable[[str, float], None] | None = None) -> None:
        self.fetch_suspects = fetch_suspects  # peer id -> the announcement (PeerRecord.updated) reported
        self.probe = probe  # True when the peer answered
        self.me = me
        self.heard = heard  # suspects told us directly, in the same form (peer/crash_notices.py)
        self.on_dead = on_dead  # (peer id, announcement) on each new failed probe: we tell others
        self._verdicts: dict[tuple[str, float], bool] = {}  # (peer id, updated) -> answered our probe

    async def read_reports(self) -> dict[str, float]:
        """The suspects clients reported on the DHT; none when the read fails (we screen on what we heard)."""
        try:
            return await self.fetch_suspects()
        except Exception as e:
            logger.debug("could not read the suspects: %s", e)
            return {}

    async def screen(self, view: SwarmView, reported: dict[str, float] | None = None) -> SwarmView:
        """`view` less the suspects (heard, or `reported`: read_reports, or read now when None) our probe fails."""
        suspects = self.heard()
        if reported is None:
            reported = await self.read_reports()
        for peer_id, announced in reported.items():
            suspects[peer_id] = max(announced, suspects.get(peer_id, announced))
        suspected: list[tuple[str, float]] = []  # (peer id, announcement) of suspects still in the view
        for peer_id, announced in sorted(suspects.items()):
            record = view.records.get(peer_id)
            if record is None or peer_id == self.me() or record.updated > announced:
                continue  # gone already, ourselves, or announced again since the report
            suspected.append((peer_id, record.updated))
        unjudged = [key for key in suspected if key not in self._verdicts][:MAX_PROBES_PER_READ]
        # At once, not one after another: a vanished host never answers, so its probe takes the whole timeout.
        verdicts = await asyncio.gather(*(self.probe(peer_id) for peer_id, _ in unjudged))
        for key, answered in zip(unjudged, verdicts):
            self._remember(key, answered)
            if not answered:
                if self.on_dead is not None:
                    self.on_dead(*key)
                logger.info("peer %s was reported unreachable and does not answer us either: "
                            "balancing as if its record (layers %s) had expired", key[0], view.records[key[0]].layers)
        dead = {peer_id for peer_id, updated in suspected if self._verdicts.get((peer_id, updated)) is False}
        if not dead:
            return view
        return replace(view, records={p: r for p, r in view.records.items() if p not in dead})

    def _remember(self, key: tuple[str, float], answered: bool) -> None:
        self._verdicts[key] = answered
        while len(self._verdicts) > MAX_VERDICTS:
            del self._verdicts[next(iter(self._verdicts))]
