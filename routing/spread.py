"""choose_route: spread sessions over parallel routes so that a busy swarm serves near its max flow.

plan_route gives every client the same fastest route, so under load its peers queue while
parallel peers idle. Here a busy swarm is treated as a flow. Each peer offers spare
capacity c_p = its throughput x its layers x its spare fraction (free KV pages / all pages,
as announced) x penalties. Each layer l splits the sessions crossing it in proportion to
per-peer weights, x[p][l] = w_p / S_l with S_l = sum of w over the servers of l; one weight
per peer keeps a route on a peer for its whole range unless the split changes.

flow_weights picks w: starting from w_p = c_p / k_p (spare throughput), it repeats
w_p *= F_p / F, where F_p is the flow at which peer p would be full under the current split
and F the smallest of them (the flow the split can carry). Underused peers gain share until
the peers are equally full; on random swarms 40 rounds reach 98-100% of the exact max flow
(routing.flow; tests/test_routing_spread.py), in O(rounds x (peers + layers)).

sample_route draws one route whose chance of using p at layer l is exactly x[p][l]/sum, with
as few peer switches as that allows: at each boundary a route stays on its peer with
probability min(1, x[p][l] / x[p][l-1]) and otherwise switches to a peer q with probability
proportional to the share q gains there, max(0, x[q][l] - x[q][l-1]). (By induction the mass
on p at l is min(x_prev, x) + max(0, x - x_prev) = x[p][l].) Announced load lags by an
announce period; the next announcement corrects the weights.

When the fastest route still has room (every peer on it at least IDLE_SPARE free), adding a
session there barely slows anyone, and a session's latency is what matters: choose_route
then returns plan_route's answer.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence

from routing.costs import RouteCosts
from routing.route import NoRouteError, _uncovered, plan_route
from swarm.types import SERVING, Hop, LayerRange, PeerRecord, Route, SwarmView

# Below half its pages free, a peer's queueing delay (~1 / (1 - load)) has doubled: from there
# on, new sessions are spread rather than piled onto the fastest route.
IDLE_SPARE = 0.5
# A full peer still gets this share of its throughput as weight: announcements lag by an
# announce period, and a swarm where every peer is full should still split by speed.
SPARE_FLOOR = 0.05
# Weight factors mirroring RouteCosts' penalties: such peers carry sessions only where
# (nearly) nothing else serves a layer. Ordered as the penalties: short of pages, draining, banned.
LOW_PAGES_FACTOR = 1e-3
DRAINING_FACTOR = 1e-6
BANNED_FACTOR = 1e-9
# Shares this close count as unchanged (no switch for float noise).
SHARE_EPSILON = 1e-12
# Rounds of flow_weights: 40 reach within 2.3% of the max flow on every random swarm tested
# (mean 99.9%), at ~40 x (peers + layers) steps, a few ms for 1,000 peers.
FLOW_ROUNDS = 40
# Weights are kept within this factor of the largest: a sole server's weight does not matter
# (it carries its layers alone), and letting it drift to 0 would make its layers' S_l vanish.
WEIGHT_FLOOR = 1e-12
# One round changes a weight by at most this factor, so one extreme peer (a sole server near
# zero capacity) cannot swing the others by orders of magnitude at once.
MAX_STEP = 10.0


def spare_fraction(record: PeerRecord) -> float:
    """The announced share of a peer's KV pages still free (1 when it announces no pool)."""
    if record.total_pages <= 0:
        return 1.0
    return min(1.0, max(0.0, record.free_pages / record.total_pages))


def route_weight(record: PeerRecord, ban_level: float, pages_needed: int) -> float:
    """Tokens/s a peer offers new sessions: throughput x spare fraction (floored) x penalties."""
    weight = max(record.throughput, 1e-9) * max(spare_fraction(record), SPARE_FLOOR)
    if pages_needed > 0 and record.free_pages < pages_needed:
        weight *= LOW_PAGES_FACTOR
    if record.last_resort:  # draining, moving or standby
        weight *= DRAINING_FACTOR
    if ban_level > 0:
        weight *= BANNED_FACTOR**ban_level
    return weight


def sample_route(
    view: SwarmView,
    rng: random.Random,
    *,
    start: int = 0,
    end: int | None = None,
    banned: Mapping[str, float] | None = None,
    pages_needed: int = 0,
    exclude: Collection[str] = (),
) -> Route:
    """A route over [start, end) drawn from the spare-capacity flow (see the module docstring).

    Deterministic for a given `rng` state. Raises NoRouteError naming uncovered layers.
    """
    end = view.num_layers if end is None else end
    if not 0 <= start < end <= view.num_layers:
        raise ValueError(f"cannot route layers {start}:{end} of a {view.num_layers}-layer model")
    banned = banned or {}
    excluded = set(exclude)
    peers = sorted(
        (r for r in view.records.values()
         if r.state in SERVING and r.peer_id not in excluded and r.layers.start < end and r.layers.end > start),
        key=lambda r: r.peer_id,
    )
    uncovered = _uncovered(peers, start, end)
    if uncovered:
        raise NoRouteError(view.model, uncovered)
    n = end - start
    spans = [LayerRange(max(r.layers.start, start) - start, min(r.layers.end, end) - start) for r in peers]
    capacities = [route_weight(r, banned.get(r.peer_id, 0.0), pages_needed) * len(r.layers) for r in peers]
    weights = flow_weights(spans, capacities, n)
    starting_at: list[list[int]] = [[] for _ in range(n)]
    total = [0.0] * n  # S_l
    for index, span in enumerate(spans):
        starting_at[span.start].append(index)
        for layer in range(span.start, span.end):
            total[layer] += weights[index]

    def ends(index: int) -> int:
        return min(peers[index].layers.end, end) - start

    active: list[int] = []
    route: list[tuple[int, int]] = []  # (peer index, first layer), relative to start
    current = -1
    for layer in range(n):
        active = [i for i in active if ends(i) > layer] + starting_at[layer]
        if current >= 0 and ends(current) > layer:
            keep = total[layer - 1] / total[layer]  # x[cur][l] / x[cur][l-1]
            if keep >= 1.0 - SHARE_EPSILON or rng.random() < keep:
                continue
        gains = []
        for i in active:
            before = weights[i] / total[layer - 1] if layer > 0 and peers[i].layers.start < layer + start else 0.0
            gains.append(max(0.0, weights[i] / total[layer] - before))
        if sum(gains) <= SHARE_EPSILON:  # only float noise moved: draw from the layer's shares
            gains = [weights[i] for i in active]
        drawn = active[_draw(rng, gains)]
        if drawn != current:
            current = drawn
            route.append((current, layer))
    hops = []
    for position, (index, first) in enumerate(route):
        last = route[position + 1][1] if position + 1 < len(route) else n
        hops.append(Hop(peers[index].peer_id, LayerRange(first + start, last + start)))
    return tuple(hops)


def full_flows(spans: Sequence[LayerRange], capacities: Sequence[float], weights: Sequence[float],
               num_layers: int) -> list[float]:
    """Per peer, the flow F_p at which it is full when every layer splits its sessions in proportion
    to `weights` (x[p][l] = w_p / S_l): p carries w_p * sum_{l in p} 1/S_l per unit of flow."""
    delta = [0.0] * (num_layers + 1)
    for span, w in zip(spans, weights):
        delta[span.start] += w
        delta[span.end] -= w
    inverse = [0.0] * num_layers  # 1 / S_l
    running = 0.0
    for layer in range(num_layers):
        running += delta[layer]
        inverse[layer] = 1.0 / running
    # Summed per span, not as a difference of prefix sums: a stretch of floored weights makes 1/S_l
    # ~1e12 there, and prefix sums past it would round a later peer's whole span to 0.
    return [c / (w * sum(inverse[span.start : span.end])) for span, c, w in zip(spans, capacities, weights)]


def flow_weights(spans: Sequence[LayerRange], capacities: Sequence[float], num_layers: int) -> list[float]:
    """Per-peer weights whose per-layer proportional split carries (nearly) the max flow.

    `spans` are the peers' layers within [0, num_layers), which they must cover; `capacities`
    their spare layer-tokens/s (> 0). See the module docstring for the iteration.
    """
    weights = [c / len(span) for span, c in zip(spans, capacities)]
    best, best_flow = weights, -1.0
    for _ in range(FLOW_ROUNDS + 1):
        full_at = full_flows(spans, capacities, weights, num_layers)
        flow = min(full_at)
        if flow > best_flow:
            best, best_flow = weights, flow
        steps = [min(MAX_STEP, f / flow) for f in full_at]
        top = max(w * step for w, step in zip(weights, steps))
        weights = [max(w * step / top, WEIGHT_FLOOR) for w, step in zip(weights, steps)]
    return best


def choose_route(
    view: SwarmView,
    rng: random.Random,
    *,
    start: int = 0,
    end: int | None = None,
    costs: RouteCosts = RouteCosts(),
    banned: Mapping[str, float] | None = None,
    pages_needed: int = 0,
    exclude: Collection[str] = (),
) -> Route:
    """The fastest route while each of its peers has IDLE_SPARE room, else a spread one (sample_route)."""
    fastest = plan_route(view, start=start, end=end, costs=costs, banned=banned,
                         pages_needed=pages_needed, exclude=exclude)
    if all(spare_fraction(view.records[hop.peer_id]) >= IDLE_SPARE for hop in fastest):
        return fastest
    return sample_route(view, rng, start=start, end=end, banned=banned, pages_needed=pages_needed,
                        exclude=exclude)


def _draw(rng: random.Random, weights: list[float]) -> int:
    """Index i with probability weights[i] / sum(weights) (one uniform draw, fixed order)."""
    point = rng.random() * sum(weights)
    for index, weight in enumerate(weights):
        point -= weight
        if point < 0:
            return index
    return max(range(len(weights)), key=lambda i: weights[i])  # float residue: the heaviest
