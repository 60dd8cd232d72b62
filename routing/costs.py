"""What one hop of a route costs, in estimated seconds per generated token.

The planner adds these numbers along a path, so every term is in seconds and
penalties are large additive seconds rather than removals: a penalised peer is still
usable when nothing else serves its layers.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarm.types import LayerRange, PeerRecord


@dataclass(frozen=True)
class RouteCosts:
    """Constants of the route cost model; each default says why it has that value."""

    # A round trip between two home connections on one continent is 20-100 ms; 50 ms is the
    # middle, so an unmeasured peer is neither preferred nor shunned against measured ones.
    default_rtt: float = 0.05
    # Serialising hidden states, framing, and a scheduler wake-up on the peer cost a few ms
    # per hop whatever the network; it also makes fewer, longer hops win near-ties.
    hop_overhead: float = 0.005
    # A peer without free KV pages for the session must queue or evict, which stalls the
    # whole route; 10 s outweighs any ordinary route (tens of hops at ~0.1 s) so such a peer
    # is used only where no peer with room serves the layers, yet stays below a ban.
    low_pages_penalty: float = 10.0
    # Per ban level (see BanList.penalties): a peer that just failed costs more than any
    # route that avoids it, including routes through peers short of pages, so it is taken
    # only when it is the sole server of some layer.
    ban_penalty: float = 10_000.0
    # A DRAINING peer still serves but is leaving, and a moving one (record `moving_to`) swaps
    # its engine soon: a session opened on either must fail over and replay its history
    # elsewhere before long. A standby (record `standby`) is a slow safety net. 1000 s puts
    # each behind any working route, even one through peers short of pages, yet ahead of a
    # banned peer, which failed outright (PeerRecord.last_resort).
    draining_penalty: float = 1_000.0
    # A relayed peer (behind NAT, reached through a libp2p circuit relay) adds the relay's round
    # trip to every step, one more default_rtt; and relays cap each circuit's time and bytes
    # (p2pd: 30 min, 4 GiB), so a direct peer of similar speed is the better choice.
    relayed_penalty: float = 0.05
    # Records may announce 0 throughput before their first measurement; dividing by this
    # floor treats them as very slow (1000 s per token) instead of infinitely slow.
    min_throughput: float = 1e-3


def hop_cost(
    record: PeerRecord,
    layers: LayerRange,
    rtt: float | None,
    costs: RouteCosts,
    pages_needed: int,
) -> float:
    """Estimated seconds per token for sending one step through `layers` of `record`'s peer.

    = round trip + per-hop overhead + compute + a penalty when the peer has fewer free KV
    pages than the session needs. Compute is the share of the peer's announced throughput
    (tokens/s through ALL its layers) that `layers` uses: len(layers) / len(record.layers)
    / throughput.
    """
    return _fixed_cost(record, rtt, costs, pages_needed) + len(layers) * _per_layer_cost(record, costs)


def _fixed_cost(record: PeerRecord, rtt: float | None, costs: RouteCosts, pages_needed: int) -> float:
    """The part of a hop's cost that does not depend on how many layers it takes."""
    cost = (costs.default_rtt if rtt is None else rtt) + costs.hop_overhead
    if pages_needed > 0 and record.free_pages < pages_needed:
        cost += costs.low_pages_penalty
    if record.relayed:
        cost += costs.relayed_penalty
    if record.last_resort:
        cost += costs.draining_penalty
    return cost


def _per_layer_cost(record: PeerRecord, costs: RouteCosts) -> float:
    """Seconds per token for each layer taken from this peer."""
    return 1.0 / (len(record.layers) * max(record.throughput, costs.min_throughput))
