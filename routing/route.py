"""plan_route: the fastest chain of peers covering a span of layers.

Nodes are layer boundaries start..end; peer p serving [s, e) gives an edge i -> j for
every s <= i < j <= e, costing hop_cost(p, [i, j)) (+ a ban penalty). Every edge goes
forward, so the graph is a DAG and one sweep over the boundaries in order is an exact
shortest-path algorithm (what Dijkstra would compute, without a heap).

The cost of an edge is linear in its length, fixed_p + (j - i) * slope_p, so for each peer
the best origin for any j is the one minimising dist[i] - i * slope_p, kept as a running
minimum while sweeping. That makes planning O(sum over peers of layers served) instead of
O(peers * layers^2): a 1000-peer, 60-layer swarm plans in a few milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

from routing.costs import RouteCosts, _fixed_cost, _per_layer_cost
from swarm.types import SERVING, Hop, LayerRange, PeerRecord, Route, SwarmView

# Costs closer than this (seconds) count as equal, so that floating-point noise never
# decides between two equally good routes; the tie-breakers below do, deterministically.
TIE_EPSILON = 1e-9


class NoRouteError(Exception):
    """No chain of usable peers covers the requested layers; `uncovered` lists the gaps."""

    def __init__(self, model: str, uncovered: list[int]) -> None:
        self.model = model
        self.uncovered = list(uncovered)
        spans = _spans(self.uncovered)
        names = ", ".join(f"{a}-{b - 1}" if b - a > 1 else f"{a}" for a, b in spans)
        commands = " and ".join(f"`swarm-peer serve --layers {a}:{b}`" for a, b in spans)
        plural = "s" if len(self.uncovered) > 1 else ""
        super().__init__(
            f"no peer serves layer{plural} {names} of model {model}; "
            f"start a peer with {commands}"
        )


def plan_route(
    view: SwarmView,
    *,
    start: int = 0,
    end: int | None = None,
    costs: RouteCosts = RouteCosts(),
    banned: Mapping[str, float] | None = None,
    pages_needed: int = 0,
    exclude: Collection[str] = (),
) -> Route:
    """The route over serving peers covering [start, end) with the lowest estimated time per token.

    Last-resort peers (DRAINING, moving, standby: PeerRecord.last_resort) cost
    `costs.draining_penalty` extra: they carry new sessions only where no other peer serves a layer.

    `banned` maps peer id -> ban level (BanList.penalties); each level adds
    `costs.ban_penalty` seconds, so banned peers are used only where nothing else serves a
    layer. Peers in `exclude` are never used. Ties (costs within TIE_EPSILON) go to fewer
    hops, then to the lower peer id of the last hop, then to the longer last hop.
    Raises NoRouteError naming the layers that no usable peer serves.
    """
    end = view.num_layers if end is None else end
    if not 0 <= start < end <= view.num_layers:
        raise ValueError(f"cannot route layers {start}:{end} of a {view.num_layers}-layer model")
    banned = banned or {}
    excluded = set(exclude)
    peers = sorted(
        (
            r
            for r in view.records.values()
            if r.state in SERVING
            and r.peer_id not in excluded
            and r.layers.start < end
            and r.layers.end > start
        ),
        key=lambda r: r.peer_id,
    )
    uncovered = _uncovered(peers, start, end)
    if uncovered:
        raise NoRouteError(view.model, uncovered)

    # Per peer: [lo, hi, fixed, slope, peer index]; positions are relative to `start`.
    n = end - start
    starting_at: list[list[tuple[int, float, float, int]]] = [[] for _ in range(n)]
    for index, r in enumerate(peers):
        fixed = _fixed_cost(r, view.rtt.get(r.peer_id), costs, pages_needed)
        fixed += costs.ban_penalty * banned.get(r.peer_id, 0.0)
        lo = max(r.layers.start, start) - start
        hi = min(r.layers.end, end) - start
        starting_at[lo].append((hi, fixed, _per_layer_cost(r, costs), index))

    dist = [math.inf] * (n + 1)
    hops = [0] * (n + 1)
    prev: list[tuple[int, int]] = [(-1, -1)] * (n + 1)  # (peer index, origin boundary)
    dist[0] = 0.0
    # Active peers as mutable rows: [hi, fixed, slope, index, best_value, best_origin].
    active: list[list] = []
    for j in range(1, n + 1):
        i = j - 1
        active = [row for row in active if row[0] >= j]
        active.extend([hi, fixed, slope, index, math.inf, -1] for hi, fixed, slope, index in starting_at[i])
        di, hi_ = dist[i], hops[i]
        best_cost, best_hops, best_peer, best_origin = math.inf, 0, -1, -1
        for row in active:
            slope = row[2]
            value = di - i * slope
            if value < row[4] - TIE_EPSILON or (
                value <= row[4] + TIE_EPSILON and hi_ < hops[row[5]]
            ):
                row[4], row[5] = value, i
            origin = row[5]
            cost = dist[origin] + row[1] + (j - origin) * slope
            h = hops[origin] + 1
            if cost < best_cost - TIE_EPSILON or (
                cost <= best_cost + TIE_EPSILON
                and (h, row[3], -origin) < (best_hops, best_peer, -best_origin)
            ):
                best_cost, best_hops, best_peer, best_origin = cost, h, row[3], origin
        dist[j], hops[j], prev[j] = best_cost, best_hops, (best_peer, best_origin)

    route: list[Hop] = []
    j = n
    while j > 0:
        index, origin = prev[j]
        route.append(Hop(peers[index].peer_id, LayerRange(origin + start, j + start)))
        j = origin
    return tuple(reversed(route))


def route_cost(
    view: SwarmView,
    route: Route,
    *,
    costs: RouteCosts = RouteCosts(),
    banned: Mapping[str, float] | None = None,
    pages_needed: int = 0,
) -> float:
    """The estimated seconds per token of `route` under the same model plan_route minimises."""
    banned = banned or {}
    total = 0.0
    for hop in route:
        r = view.records[hop.peer_id]
        total += _fixed_cost(r, view.rtt.get(hop.peer_id), costs, pages_needed)
        total += costs.ban_penalty * banned.get(hop.peer_id, 0.0)
        total += len(hop.layers) * _per_layer_cost(r, costs)
    return total


def _uncovered(peers: list[PeerRecord], start: int, end: int) -> list[int]:
    """Layers in [start, end) that none of `peers` serves (a difference array, O(peers + layers))."""
    delta = [0] * (end - start + 1)
    for r in peers:
        delta[max(r.layers.start, start) - start] += 1
        delta[min(r.layers.end, end) - start] -= 1
    out, running = [], 0
    for offset in range(end - start):
        running += delta[offset]
        if running == 0:
            out.append(start + offset)
    return out


def _spans(layers: list[int]) -> list[tuple[int, int]]:
    """Sorted layer ids -> half-open runs of consecutive ids."""
    spans: list[tuple[int, int]] = []
    for layer in layers:
        if spans and spans[-1][1] == layer:
            spans[-1] = (spans[-1][0], layer + 1)
        else:
            spans.append((layer, layer + 1))
    return spans
