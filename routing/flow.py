"""max_flow_throughput: how many tokens/s a fixed placement can serve at best (the optimum to beat).

Model. A peer announcing `throughput` t over k layers pushes one token through all k in 1/t
seconds, so through one of its layers in 1/(k t): it has c = k * t layer-tokens/s of capacity
that routes may spend on any of its layers (the cost model of routing/costs.py). A swarm
serving F tokens/s needs F layer-tokens/s on every layer. A route may switch peers at any
layer boundary, so F is feasible iff per-peer, per-layer rates x[p][l] >= 0 exist with

    sum over l of x[p][l] <= c_p      (every peer within its capacity)
    sum over p of x[p][l] >= F        (every layer carries the whole flow)
    x[p][l] = 0 unless p serves l.

This is the layer graph's max flow (source -> peers -> layers -> sink, one unit of F per
layer). Network links are not a capacity here: hidden states of one token are kilobytes,
so compute, not bandwidth, limits a swarm of home GPUs; latency shows up in route costs.

Each peer's layers are one interval, so the bipartite graph is convex and feasibility is
decided exactly by a greedy (Glover's rule): walk the layers in order and feed each one
from the peers whose intervals end soonest. A bisection on F around that check gives the
maximum to a relative 1e-9 in O(iterations x peers log peers).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass

from swarm.types import LayerRange, PeerRecord, PeerState, SwarmView

# Bisection stops when the bracket is this small relative to the answer: far below any
# throughput difference that matters, and ~40 iterations from the initial bracket.
RELATIVE_TOLERANCE = 1e-9
# bottleneck_layer only needs where the flow runs dry, not its exact value: a bisection to
# 0.1% takes ~10 rounds instead of ~35 (a join decision stays well under 100 ms at 5,000
# layers), and probing 0.2% above still fails at the binding layer.
BOTTLENECK_TOLERANCE = 1e-3


def peer_capacities(view: SwarmView, states: Iterable[PeerState] = (PeerState.ONLINE,)) -> list[tuple[LayerRange, float]]:
    """(layers clipped to the model, layer-tokens/s) of every peer in `states`, in peer-id order."""
    wanted = set(states)
    out = []
    for peer_id in sorted(view.records):
        r: PeerRecord = view.records[peer_id]
        if r.state not in wanted or r.layers.start >= view.num_layers:
            continue
        layers = LayerRange(r.layers.start, min(r.layers.end, view.num_layers))
        out.append((layers, len(r.layers) * max(r.throughput, 0.0)))
    return out


def feasible(placement: list[tuple[LayerRange, float]], num_layers: int, flow: float) -> bool:
    """Can `placement` ((layers, layer-tokens/s) per peer) carry `flow` tokens/s through every layer?"""
    return flow <= 0 or _first_short_layer(placement, num_layers, flow) is None


def bottleneck_layer(placement: list[tuple[LayerRange, float]], num_layers: int) -> int | None:
    """Where the placement runs dry: the first layer the greedy cannot feed just above the max flow.

    Capacity added to a window holding this layer raises the max flow; elsewhere it may not.
    None when some layer is uncovered (then the gaps come first) or nobody serves.
    """
    return flow_and_bottleneck(placement, num_layers)[1]


def flow_and_bottleneck(placement: list[tuple[LayerRange, float]], num_layers: int,
                        tolerance: float = BOTTLENECK_TOLERANCE) -> tuple[float, int | None]:
    """(max flow to `tolerance`, at most that far below the exact one; bottleneck_layer)."""
    flow = max_flow_of(placement, num_layers, tolerance)
    if flow <= 0:
        return flow, None
    # The true maximum is below flow / (1 - tolerance) < this probe, so the probe surely fails.
    return flow, _first_short_layer(placement, num_layers, flow * (1 + 2 * tolerance))


def _first_short_layer(placement: list[tuple[LayerRange, float]], num_layers: int, flow: float) -> int | None:
    """feasible()'s greedy, returning the first layer it cannot feed (None: it feeds them all)."""
    return _feed(placement, num_layers, flow, stop_at_first=True).first_short


@dataclass(frozen=True)
class GreedyFeed:
    """Glover's greedy run through every layer at one flow (feed_greedily)."""

    first_short: int | None  # the first layer it cannot feed in full (None: it feeds them all)
    shortfall: float  # layer-tokens/s it could not feed, over all layers: 0 iff the flow is feasible
    unused: list[float]  # per peer (placement order), capacity left when its window ended: wasted there


def feed_greedily(placement: list[tuple[LayerRange, float]], num_layers: int, flow: float) -> GreedyFeed:
    """Feed every layer `flow` from the peers whose intervals end soonest, on past the short layers.

    On a convex graph this greedy feeds the most any rates could, so `shortfall` is exactly what
    `placement` lacks for `flow`, and `unused` says which peers' windows end with capacity nobody
    could take: where a placement search should shift windows (benchmarks/sim_optimum.climbed_placement).
    """
    return _feed(placement, num_layers, flow, stop_at_first=False)


def _feed(placement: list[tuple[LayerRange, float]], num_layers: int, flow: float, stop_at_first: bool) -> GreedyFeed:
    """The greedy of feasible() and feed_greedily(): stops at the first short layer or feeds them all.

    Between two consecutive interval ends or starts the open peers do not change, so the greedy
    feeds such a run of m layers in one go: m * flow drawn from the soonest-ending peers first,
    as layer-by-layer feeding would. O((peers) log peers), not O(layers): 3-4x faster at 7,000 layers.
    """
    starting: dict[int, list[list]] = {}
    bounds = {0, num_layers}
    for index, (layers, capacity) in enumerate(placement):
        if capacity > 0:
            starting.setdefault(layers.start, []).append([layers.end, capacity, index])
            bounds.update((min(layers.start, num_layers), min(layers.end, num_layers)))
    residue = flow * RELATIVE_TOLERANCE * 1e-3  # float residue, far below the bisection tolerance
    unused = [] if stop_at_first else [0.0] * len(placement)
    open_peers: list[list] = []  # heap of [end, remaining capacity, index]
    first_short: int | None = None
    shortfall = 0.0
    edges = sorted(bounds)
    for first, stop in zip(edges, edges[1:]):
        for entry in starting.get(first, ()):
            heapq.heappush(open_peers, entry)
        while open_peers and open_peers[0][0] <= first:
            entry = heapq.heappop(open_peers)  # ended before this run: its rest is lost
            if unused:
                unused[entry[2]] = entry[1]
        need = (stop - first) * flow
        while need > residue:
            if not open_peers:  # fed (stop - first) * flow - need: that many whole layers
                if first_short is None:
                    first_short = first + int(((stop - first) * flow - need + residue) / flow)
                    if stop_at_first:  # feasible() needs no more: the shortfall is this run's alone
                        return GreedyFeed(first_short, need, unused)
                shortfall += need
                break
            top = open_peers[0]
            take = min(top[1], need)
            need -= take
            top[1] -= take
            if top[1] <= 0:
                heapq.heappop(open_peers)
    for entry in open_peers:
        if unused:
            unused[entry[2]] = entry[1]
    return GreedyFeed(first_short, shortfall, unused)


def max_flow_of(placement: list[tuple[LayerRange, float]], num_layers: int,
                tolerance: float = RELATIVE_TOLERANCE) -> float:
    """The largest tokens/s `placement` can carry through layers [0, num_layers) (0 if any is uncovered).

    Exact to a relative `tolerance` (the result is feasible and at most that far below the maximum).
    """
    if num_layers <= 0:
        raise ValueError(f"a model has at least one layer, got {num_layers}")
    per_layer_thr = [0.0] * num_layers  # every peer spreading evenly: a feasible flow
    per_layer_cap = [0.0] * num_layers  # every peer spending everything on one layer: a bound
    for layers, capacity in placement:
        for layer in range(layers.start, layers.end):
            per_layer_thr[layer] += capacity / len(layers)
            per_layer_cap[layer] += capacity
    lo = min(per_layer_thr)
    hi = min(min(per_layer_cap), sum(c for _, c in placement) / num_layers)
    if hi <= 0:
        return 0.0
    while hi - lo > tolerance * hi:
        mid = (lo + hi) / 2
        if feasible(placement, num_layers, mid):
            lo = mid
        else:
            hi = mid
    return lo


def max_flow_throughput(view: SwarmView, states: Iterable[PeerState] = (PeerState.ONLINE,)) -> float:
    """Tokens/s the peers of `view` in `states` can serve at most in their current placement."""
    return max_flow_of(peer_capacities(view, states), view.num_layers)


def capacity_bound(view: SwarmView, states: Iterable[PeerState] = (PeerState.ONLINE,)) -> float:
    """sum(capacity) / layers: no placement of these peers carries more (perfectly divisible capacity)."""
    return sum(c for _, c in peer_capacities(view, states)) / view.num_layers
