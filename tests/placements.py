"""A Placement (peer/balancer.py) on a scripted view, for driving the balancer's loops without a peer process."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from peer.balancer import Placement
from peer.config import PeerConfig
from shards.config import ModelConfig
from swarm.types import LayerRange, SwarmView

Migrate = Callable[[LayerRange, "list[int] | None", "SwarmView | None", float], Awaitable[bool]]


async def always_moves(target: LayerRange, order: list[int] | None, decided_on: SwarmView | None,
                       confirm_s: float = 1.0) -> bool:
    return True


def scripted_placement(model: Path, fetch_view: Callable[[], Awaitable[SwarmView]], *, peer_id: str,
                       layers: LayerRange, migrate: Migrate = always_moves, open_sessions: int = 0,
                       **config: Any) -> Placement:
    """A peer `peer_id` serving `layers` of the tiny model at `model`, reading the swarm through `fetch_view`;
    `config` sets PeerConfig's fields (watch_period, balance_period, standby, ...)."""
    return Placement(
        config=PeerConfig(model, None, "m", **config), model_config=ModelConfig.from_pretrained(model),
        fetch_view=fetch_view, peer_id=lambda: peer_id, visible_maddrs=lambda: [], layers=lambda: layers,
        throughput=lambda: 1.0, migrate=migrate, open_sessions=lambda: open_sessions,
    )
