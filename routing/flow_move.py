"""Flow moves: a peer moves to where the swarm's max flow runs dry, when that raises it enough.

should_move (routing/balance.py) weighs per-layer strengths and moves only for a 1/quality
gain on the layers it touches, so it comes to rest well below what a good placement carries
(docs/balancing.md: 62-73% of the capacity bound without churn, against 89-90% for the one-pass
largest-first placement). The max flow (routing/flow.py) sees what strengths do not: a peer
can spend its capacity on any of its layers, and what limits the swarm is one stretch where
the flow runs dry. A flow move is the join rule applied again to a running peer: the window
holding the swarm's bottleneck layer (routing.flow.bottleneck_layer) of lowest total throughput
(choose_layers' flow-aware branch), taken when the swarm with the peer there can carry
FLOW_MOVE_GAIN more than the swarm's max flow now. One max flow per view serves every peer's
check; each check itself is one greedy pass (routing.flow.feasible).

Each flow move strictly raises the swarm's max flow, so they cannot cycle; and a peer makes one
at most every FLOW_MOVE_COOLDOWN_S, which bounds what they add to the move budget. Like any
move, it leaves no layer dark or thin behind it (balance.leaves_safely).
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.balance import (
    balanced_placement,
    layer_servers,
    layer_throughput,
    leaves_safely,
    staying_throughput,
    thin_threshold,
    window_holding,
)
from routing.flow import feasible, flow_and_bottleneck
from swarm.types import LayerRange, SwarmView

# A flow move must raise the swarm's max flow by this share. 1%: a 4-layer peer's reload costs
# its own share of capacity (0.1-0.5% at 200-1,000 peers) for 20-120 s; a gain held for the
# next hour repays that many times over. Measured in the simulator (docs/balancing.md, 200 peers,
# 2x): 1% and 2% gave the same flow; 4% gave back most of the gain.
FLOW_MOVE_GAIN = 0.01
# A peer that moved (for any reason) less than this long ago makes no flow move. Without it
# flow moves went 1.1-1.4 per peer-hour at 200 peers (the budget is 1): a departure shifts the
# bottleneck, and the same peers chased it. One hour keeps the whole rule at 0.8-0.9.
FLOW_MOVE_COOLDOWN_S = 3600.0


def plan_flow_move(
    others: list[tuple[LayerRange, float]],
    num_layers: int,
    current: LayerRange,
    my_capacity: float,
    tier_throughput: Sequence[float],
    others_online: Sequence[int],
    others_staying: Sequence[float] | None = None,
    thin_limit: float = 0.0,
    swarm_flow: tuple[float, int | None] | None = None,
    gain: float = FLOW_MOVE_GAIN,
) -> LayerRange | None:
    """Where a peer serving `current` should move for the max flow, or None to stay.

    `others` is the placement ((layers, layer-tokens/s), balanced_placement) without this peer;
    `tier_throughput` the per-layer throughput of its tier without it (layer_throughput's
    min_layers), which ranks the windows holding the bottleneck as a join does; `others_online` /
    `others_staying` / `thin_limit` as in plan_move. `swarm_flow` is flow_and_bottleneck of the
    whole placement, this peer included: every peer reading one view shares it (a simulator
    caches it), computed here when not given. The move must make that flow feasible `gain` higher.
    """
    if not leaves_safely(current, others_online, others_staying, thin_limit):
        return None
    flow, bottleneck = swarm_flow or flow_and_bottleneck([*others, (current, my_capacity)], num_layers)
    if bottleneck is None or current.start <= bottleneck < current.end:
        return None  # a gap comes first (should_move), or I already hold where the flow runs dry
    target = window_holding(tier_throughput, len(current), bottleneck)
    if flow <= 0 or not feasible([*others, (target, my_capacity)], num_layers, flow * (1 + gain)):
        return None
    return target


def flow_move(view: SwarmView, me: str, *, since_last_move_s: float | None,
              my_throughput: float | None = None) -> LayerRange | None:
    """plan_flow_move on a view, for peer `me` whose last move was `since_last_move_s` ago (None: never).

    Call it when should_move says stay: a move for strengths comes first.
    """
    record = view.records.get(me)
    if record is None:
        raise ValueError(f"peer {me!r} is not in the view of model {view.model}")
    if since_last_move_s is not None and since_last_move_s < FLOW_MOVE_COOLDOWN_S:
        return None
    current = LayerRange(min(record.layers.start, view.num_layers - 1), min(record.layers.end, view.num_layers))
    throughput = record.throughput if my_throughput is None else my_throughput
    return plan_flow_move(
        balanced_placement(view, without=me),
        view.num_layers,
        current,
        len(current) * max(throughput, 0.0),
        layer_throughput(view, without=me, min_layers=len(current)),
        layer_servers(view, without=me),
        staying_throughput(view, without=me),
        thin_threshold(view),
    )
