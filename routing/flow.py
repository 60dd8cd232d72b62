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
from the peers whose intervals end soonest. A search on F over that greedy (secant steps from
above, max_flow_of) gives the maximum to a relative 1e-9 in O(rounds x peers log peers), 6-10
rounds on a 1,000-2,000-peer swarm's placement.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable
from dataclasses import dataclass

from swarm.types import LayerRange, PeerRecord, PeerState, SwarmView

# The search stops when its bracket is this small relative to the answer: far below any
# throughput difference that matters.
RELATIVE_TOLERANCE = 1e-9
# bottleneck_layer only needs where the flow runs dry, not its exact value (a bisection took ~10
# rounds to 0.1% instead of ~35; the secant search meets the max flow in about as many either way),
# and probing 0.2% above still fails at the binding layer.
BOTTLENECK_TOLERANCE = 1e-3
# max_flow_of's search takes 6-10 rounds; this bound (half of it secant steps at most, then pure
# bisection, which halves the bracket each round) only guards against float noise.
MAX_SEARCH_ROUNDS = 200
# ... and starts this far above the flow of every peer spreading evenly (a feasible flow, typically
# 1-3% under the max flow of a balanced swarm), doubling the step while feasible: a secant through
# flows near the max flow meets it in a few steps, one through the far bound takes many.
FIRST_STEP = 0.03


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
    return Greedy(placement, num_layers).carries(flow)


def bottleneck_layer(placement: list[tuple[LayerRange, float]], num_layers: int) -> int | None:
    """Where the placement runs dry: the first layer the greedy cannot feed just above the max flow.

    Capacity added to a window holding this layer raises the max flow; elsewhere it may not.
    None when some layer is uncovered (then the gaps come first) or nobody serves.
    """
    return flow_and_bottleneck(placement, num_layers)[1]


def flow_and_bottleneck(placement: list[tuple[LayerRange, float]], num_layers: int,
                        tolerance: float = BOTTLENECK_TOLERANCE, greedy: Greedy | None = None) -> tuple[float, int | None]:
    """(max flow to `tolerance`, at most that far below the exact one; bottleneck_layer). `greedy`: the
    placement's Greedy when the caller has prepared it (else prepared here, once for both)."""
    if greedy is None:
        greedy = Greedy(placement, num_layers)
    flow = max_flow_of(placement, num_layers, tolerance, greedy)
    if flow <= 0:
        return flow, None
    # The true maximum is below flow / (1 - tolerance) < this probe, so the probe surely fails.
    return flow, greedy.feed(flow * (1 + 2 * tolerance), stop_at_first=True, track_unused=False).first_short


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
    return Greedy(placement, num_layers).feed(flow, stop_at_first=False, track_unused=True)


class Greedy:
    """Glover's greedy on one placement, prepared once and run at as many flows as a search needs.

    Between two consecutive interval ends or starts the open peers do not change, so the greedy
    feeds such a run of m layers in one go: m * flow drawn from the soonest-ending peers first,
    as layer-by-layer feeding would. O((peers) log peers), not O(layers): 3-4x faster at 7,000 layers.
    `with_peer` prepares the placement with one more peer from this one at C speed, for a search
    that tries one peer in many windows (routing.flow_move) without preparing the others again.
    """

    def __init__(self, placement: list[tuple[LayerRange, float]], num_layers: int) -> None:
        starting: dict[int, list[tuple[int, float, int]]] = {}
        bounds = {0, num_layers}
        for index, (layers, capacity) in enumerate(placement):
            if capacity > 0:
                starting.setdefault(layers.start, []).append((layers.end, capacity, index))
                bounds.update((min(layers.start, num_layers), min(layers.end, num_layers)))
        self.num_layers = num_layers
        self.peers = len(placement)
        self.edges = sorted(bounds)  # every run's first layer, then num_layers
        self.runs = [(first, stop, starting.get(first, ())) for first, stop in zip(self.edges, self.edges[1:])]

    def with_peer(self, layers: LayerRange, capacity: float) -> Greedy:
        """The greedy of this placement with (layers, capacity) appended: exactly what preparing the longer
        placement gives (the same runs, the new peer last among those starting with it), in O(peers) copies."""
        grown = object.__new__(Greedy)  # (not __init__: that would walk the whole placement again)
        grown.num_layers, grown.peers = self.num_layers, self.peers + 1
        grown.edges, grown.runs = self.edges, self.runs
        if capacity <= 0:
            return grown
        grown.edges, grown.runs = self.edges[:], self.runs[:]
        start, end = min(layers.start, self.num_layers), min(layers.end, self.num_layers)
        if start < self.num_layers:
            grown._split_at(start)
            at = bisect.bisect_left(grown.edges, start)
            first, stop, starters = grown.runs[at]
            grown.runs[at] = (first, stop, [*starters, (layers.end, capacity, self.peers)])
        grown._split_at(end)
        return grown

    def carries(self, flow: float) -> bool:
        """feasible(): can this placement carry `flow` tokens/s through every layer?"""
        return flow <= 0 or self.feed(flow, stop_at_first=True, track_unused=False).first_short is None

    def _split_at(self, edge: int) -> None:
        """Make `edge` a run boundary (the run holding it splits; nobody starts at the second part)."""
        at = bisect.bisect_left(self.edges, edge)
        if at < len(self.edges) and self.edges[at] == edge:
            return
        first, stop, starters = self.runs[at - 1]
        self.edges.insert(at, edge)
        self.runs[at - 1:at] = [(first, edge, starters), (edge, stop, ())]

    def feed(self, flow: float, stop_at_first: bool, track_unused: bool) -> GreedyFeed:
        """Feed every layer `flow`; `stop_at_first`: return at the first short layer (its run's shortfall
        alone); `track_unused`: fill GreedyFeed.unused (else it is empty)."""
        residue = flow * RELATIVE_TOLERANCE * 1e-3  # float residue, far below the search's tolerance
        unused = [0.0] * self.peers if track_unused else []
        open_peers: list[list] = []  # heap of [end, remaining capacity, index]
        push, pop = heapq.heappush, heapq.heappop  # (the hot loop of every max flow: names bound once)
        first_short: int | None = None
        shortfall = 0.0
        for first, stop, starting in self.runs:
            for entry in starting:
                push(open_peers, list(entry))
            while open_peers and open_peers[0][0] <= first:
                entry = pop(open_peers)  # ended before this run: its rest is lost
                if track_unused:
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
                left = top[1]
                if left <= need:  # the soonest-ending peer gives all it has left, and is done
                    need -= left
                    pop(open_peers)
                else:  # it feeds the rest of the run (left - need > 0 for floats left > need)
                    top[1] = left - need
                    need = 0.0
        if track_unused:
            for entry in open_peers:
                unused[entry[2]] = entry[1]
        return GreedyFeed(first_short, shortfall, unused)


def max_flow_of(placement: list[tuple[LayerRange, float]], num_layers: int,
                tolerance: float = RELATIVE_TOLERANCE, greedy: Greedy | None = None) -> float:
    """The largest tokens/s `placement` can carry through layers [0, num_layers) (0 if any is uncovered).

    Exact to a relative `tolerance` (the result is feasible and at most that far below the maximum).
    `greedy`: the placement's Greedy when the caller has prepared it (Greedy.with_peer).

    The search steps down from above along the greedy's shortfall at a flow F (feed_greedily): the
    most a flow can be served is concave in F (a min over cuts, each linear in F), so the shortfall,
    F * layers minus it, is convex and piecewise linear, and 0 exactly up to the max flow. A secant
    through two flows above the max flow then meets 0 at or above it, and on the last linear piece
    exactly at it. It starts just above the even spread's flow (FIRST_STEP), where the pieces are
    few: 6-10 greedy passes on a 1,000-2,000-peer placement instead of a bisection's 30-40 (at 1e-9),
    4-7x faster (about 2x at 1e-3, where the bisection stopped sooner). A secant step that does not
    halve the shortfall is followed by a bisection round, and after MAX_SEARCH_ROUNDS / 2 rounds only
    bisection rounds follow, so it always ends.
    """
    if num_layers <= 0:
        raise ValueError(f"a model has at least one layer, got {num_layers}")
    lo, most_on_one_layer = _even_spread_and_all_on_one(placement, num_layers)
    hi = min(most_on_one_layer, sum(c for _, c in placement) / num_layers)
    if hi <= 0:
        return 0.0
    if greedy is None:
        greedy = Greedy(placement, num_layers)
    if greedy.feed(hi, stop_at_first=True, track_unused=False).first_short is None:
        return hi  # (an infeasible bound usually fails at its first layers: a cheap check)
    above: list[tuple[float, float]] = []  # (flow, shortfall) of the two lowest infeasible flows tried, lowest first
    step, climb = "climb", FIRST_STEP
    for rounds in range(MAX_SEARCH_ROUNDS):
        if hi - lo <= tolerance * hi:
            break
        if step == "climb":  # from the even spread's flow up, in doubling steps while feasible
            probe, climb = min(lo * (1 + climb), (lo + hi) / 2), 2 * climb
        elif step == "confirm":  # a secant landed on a feasible flow: the max flow, as it never lands below
            probe = lo + tolerance * hi / 2
        elif step == "secant":
            (x1, s1), (x2, s2) = above
            probe = x1 - s1 * (x2 - x1) / (s2 - s1) if s2 > s1 else hi
            if not lo < probe < hi:
                probe, step = (lo + hi) / 2, "bisect"
        else:
            probe = (lo + hi) / 2
        fed = greedy.feed(probe, stop_at_first=False, track_unused=False)
        if fed.first_short is None:
            lo = probe
            if step == "secant":
                step = "confirm"
            elif step != "climb":
                step = "secant" if len(above) == 2 else "bisect"
        else:
            # A secant step that does not halve the shortfall is slow going: bisect next.
            slow = step == "secant" and fed.shortfall > above[0][1] / 2
            hi, above = probe, [(probe, fed.shortfall), *above[:1]]
            step = "secant" if len(above) == 2 and not slow else "bisect"
        if rounds >= MAX_SEARCH_ROUNDS // 2:
            step = "bisect"
    return lo


def _even_spread_and_all_on_one(placement: list[tuple[LayerRange, float]], num_layers: int) -> tuple[float, float]:
    """(min over layers of what every peer spreading evenly puts there: a feasible flow; min over layers of
    its servers' whole capacities: a bound). Each layer's sums add its servers in placement order, as a loop
    over every peer's every layer would, bit for bit; but the servers only change where a window starts or
    ends, so each peer adds to the runs between such bounds instead of to each of its layers (on a
    10,500-layer model at 2,000 peers that loop took a third of a max flow's time; this one is 2.4x faster)."""
    if any(layers.end > num_layers for layers, _ in placement):
        raise ValueError(f"a placement's windows must lie in the model's {num_layers} layers")
    edges = sorted({0, num_layers, *(layers.start for layers, _ in placement), *(layers.end for layers, _ in placement)})
    run_at = {edge: run for run, edge in enumerate(edges)}
    even = [0.0] * (len(edges) - 1)
    whole = [0.0] * (len(edges) - 1)
    for layers, capacity in placement:
        share = capacity / len(layers)
        for run in range(run_at[layers.start], run_at[layers.end]):
            even[run] += share
            whole[run] += capacity
    return min(even), min(whole)


def max_flow_throughput(view: SwarmView, states: Iterable[PeerState] = (PeerState.ONLINE,)) -> float:
    """Tokens/s the peers of `view` in `states` can serve at most in their current placement."""
    return max_flow_of(peer_capacities(view, states), view.num_layers)


def capacity_bound(view: SwarmView, states: Iterable[PeerState] = (PeerState.ONLINE,)) -> float:
    """sum(capacity) / layers: no placement of these peers carries more (perfectly divisible capacity)."""
    return sum(c for _, c in peer_capacities(view, states)) / view.num_layers
