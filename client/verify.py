"""Checking untrusted peers: recompute a hop's output on other peers and compare.

A verified step sends the hop's whole input so far (its recorded history plus this step) as a
stateless `forward` through other peers serving the same layers, and compares the rows of this
step. When they disagree, a third opinion from yet other peers decides: a peer whose output
disagrees with two others is the liar. With no third opinion to be had the check is
inconclusive and nobody is blamed (a lone disagreement could be either side's fault).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from client.errors import SwarmError
from client.forward import forward_through_swarm
from client.hop import HopSession
from routing import NoRouteError

if TYPE_CHECKING:
    from client.swarm_client import SwarmClient

logger = logging.getLogger(__name__)

# Relative tolerance by the dtype peers compute in: float32 results of a stateless pass and a
# cached decode differ by ~1e-6; half precision by ~1e-2. A lie worth catching is far larger.
TOLERANCE = {"float32": 1e-3, "bfloat16": 5e-2, "float16": 3e-2}


def agree(a: torch.Tensor, b: torch.Tensor, dtype: str) -> bool:
    scale = 1.0 + float(b.abs().max())
    return float((a - b).abs().max()) <= TOLERANCE.get(dtype, 5e-2) * scale


def _step_rows(full: torch.Tensor, lengths: list[int], new_tokens: list[int]) -> torch.Tensor:
    """The rows of the current step inside a full-history output (each sequence's last n rows)."""
    parts = [seq[-n:] for seq, n in zip(torch.split(full, lengths), new_tokens)]
    return torch.cat(parts)


async def find_liar(
    swarm: SwarmClient, hop: HopSession, x: torch.Tensor, new_tokens: list[int], y: torch.Tensor
) -> str | None:
    """The id of a peer caught returning a wrong result for this step of `hop`, or None."""
    per_seq = [torch.cat([*chunks, rows]) for chunks, rows in zip(hop.history, torch.split(x, new_tokens))]
    full, lengths = torch.cat(per_seq), [t.shape[0] for t in per_seq]
    span = (hop.layers.start, hop.layers.end)
    first_peers: list[str] = []
    try:
        first = _step_rows(await forward_through_swarm(swarm, full, lengths, *span, exclude={hop.peer_id},
                                                       used=first_peers), lengths, new_tokens)
    except (NoRouteError, SwarmError) as e:
        logger.info("cannot verify %s: no other peer serves layers %s (%s)", hop.peer_id, hop.layers, e)
        return None
    dtype = hop.record.dtype
    if agree(y, first, dtype):
        return None
    second_peers: list[str] = []
    try:
        second = _step_rows(await forward_through_swarm(swarm, full, lengths, *span,
                                                        exclude={hop.peer_id, *first_peers}, used=second_peers),
                            lengths, new_tokens)
    except (NoRouteError, SwarmError):
        logger.warning("peer %s and %s disagree on layers %s and no third opinion is available",
                       hop.peer_id, first_peers, hop.layers)
        return None
    if agree(first, second, dtype):
        return hop.peer_id
    if agree(y, second, dtype) and len(first_peers) == 1:
        return first_peers[0]
    return None
