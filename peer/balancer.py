"""Where this peer serves: pick layers on join, and move to the swarm's weakest layers later.

The decisions are the pure functions of `routing.balance`; this file only feeds them fresh
views and acts on their answers.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import TYPE_CHECKING

from peer.config import DTYPES
from peer.memory import layers_that_fit
from routing import choose_layers, should_move
from swarm.types import LayerRange

if TYPE_CHECKING:
    from peer.server import PeerServer

logger = logging.getLogger(__name__)

# Each wait is the period times a factor in [1 - JITTER, 1 + JITTER], so peers that started
# together do not all re-read the swarm and move at the same moment (herding onto one gap).
JITTER = 0.25


async def choose_initial_layers(server: PeerServer) -> LayerRange:
    cfg = server.config
    total = server.model_config.num_layers
    count = cfg.num_layers or layers_that_fit(server.model_config, DTYPES[cfg.dtype], cfg.device, cfg.cache_tokens,
                                              cfg.quant, cfg.quant_group_size)
    view = await server.node.fetch_view_async(cfg.model_name, total)
    layers = choose_layers(view, min(count, total))
    logger.info("chose layers %s (%d of %d) where the swarm is weakest", layers, len(layers), total)
    return layers


async def balance_loop(server: PeerServer) -> None:
    cfg = server.config
    while True:
        await asyncio.sleep(cfg.balance_period * random.uniform(1 - JITTER, 1 + JITTER))
        try:
            view = await server.node.fetch_view_async(cfg.model_name, server.model_config.num_layers)
            if server.peer_id not in view.records:
                continue  # our own record is not visible yet; decide on the next round
            target = should_move(view, server.peer_id, quality=cfg.balance_quality,
                                 my_throughput=server.throughput)
            if target is not None:
                await server.migrate(target)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("balancing round failed; staying on layers %s", server.layers)
