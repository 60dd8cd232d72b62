"""Stateless forward passes through the swarm (scoring, perplexity): no session, no KV cache."""

from __future__ import annotations

import logging
from collections.abc import Collection
from functools import partial
from typing import TYPE_CHECKING

import torch

from client.errors import SwarmError, is_hop_failure
from client.hop import TORCH_DTYPES
from client.stall import unless_gone
from swarm.schema import Forward, Result

if TYPE_CHECKING:
    from client.swarm_client import SwarmClient

logger = logging.getLogger(__name__)


async def forward_through_swarm(
    swarm: SwarmClient, hidden: torch.Tensor, new_tokens: list[int], start: int = 0, end: int | None = None,
    exclude: Collection[str] = (), used: list[str] | None = None,
) -> torch.Tensor:
    """hidden (N, H) of ragged sequences -> (N, H) after layers [start, end) (default: all).

    Failed hops are re-planned; peers in `exclude` are never used; the peers that computed the
    result are appended to `used` (verification asks for an opinion from other peers).
    """
    end = swarm.num_layers if end is None else end
    position, x, failures = start, hidden, 0
    while position < end:
        route = await swarm.plan(position, end, fresh=failures > 0, exclude=exclude)
        view = await swarm.view()
        for hop in route:
            record = view.records[hop.peer_id]
            try:
                stream = await swarm.open_stream(hop.peer_id)
                try:
                    request = Forward(x.to(TORCH_DTYPES.get(record.dtype, torch.float32)), list(new_tokens),
                                      (hop.layers.start, hop.layers.end))
                    reply = await unless_gone(stream.request(request.to_wire(), swarm.config.step_timeout),
                                              partial(swarm.is_alive, hop.peer_id), hop.peer_id,
                                              swarm.config.stall_probe_s, swarm.config.step_timeout)
                finally:
                    await stream.close()
            except Exception as e:
                if not is_hop_failure(e):
                    raise SwarmError(f"peer {hop.peer_id} refused the forward pass: {e}") from e
                failures += 1
                if failures > swarm.config.max_retries:
                    raise SwarmError(f"forward pass failed {failures} times; last error: {e}") from e
                logger.warning("forward through %s failed (%s); rerouting", hop.peer_id, e)
                swarm.ban(hop.peer_id, e)
                break
            x = Result.from_wire(reply, swarm.limits).hidden.to(torch.float32)
            position = hop.layers.end
            if used is not None:
                used.append(hop.peer_id)
    return x

