"""Flow moves: a peer moves to where the swarm's max flow runs dry, when that brings the swarm closer to more.

should_move (routing/balance.py) weighs per-layer strengths and moves only for a 1/quality
gain on the layers it touches, so it comes to rest well below what a good placement carries
(docs/balancing.md: 62-73% of the capacity bound without churn, against 89-90% for the one-pass
largest-first placement). The max flow (routing/flow.py) sees what strengths do not: a peer
can spend its capacity on any of its layers, and what limits the swarm is where the flow runs
dry. A flow move aims flow_move_gain above the swarm's max flow now (a share that scales with
what the mover gives up: its capacity share of the swarm, between FLOW_MOVE_GAIN_FLOOR and
FLOW_MOVE_GAIN). One max flow per view (swarm_flow, exact to FLOW_TOLERANCE) serves every peer's
check.

Glover's greedy at the aim (routing.flow.feed_greedily) says exactly how much the swarm lacks there
and the first layer where it does; of the windows of the mover's size holding that layer, the one
that leaves the least lacking is the target (ties: the lowest total throughput of the mover's tier,
staggered as a join's). It moves when that cuts what is lacking by SHORTFALL_CUT at least and the
max flow does not fall. A greedy pass per candidate window. A placement balanced this far has a
flat-bottomed max flow, several separate stretches within a hair of it (docs/balancing.md,
twenty-second session), and one move lifts only one of them: a rule that moved only when one window
reached the aim (`search=False`, the rule before the twenty-eighth session) soon made no move, and
resting 200-peer swarms sat at 64-88% of sum(c) / L; searching lifts them to 90-97% (seeds 0-3). Under
10%/h churn searching alone bought its flow with moves the budget did not have (1,000 peers over 1
move per peer-hour); with the strength moves that do not pay held back (routing.move_gate) it has
the budget (docs/balancing.md, twenty-ninth session). These moves cannot cycle: each keeps the max
flow and either raises it or, at the same flow (so the same aim), cuts the shortfall there by a fixed
share; the pair (flow, - shortfall) strictly improves over a finite set of placements.

A peer makes a flow move at most every FLOW_MOVE_COOLDOWN_S, which bounds what they add to the move
budget. Like any move, it leaves no layer dark or thin behind it (leaving.leaves_safely).
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.balance import window_holding, window_total
from routing.flow import Greedy, flow_and_bottleneck
from routing.layer_view import (
    balanced_placement,
    crossing_throughput,
    layer_servers,
    layer_throughput,
    staying_throughput,
)
from routing.leaving import leaves_safely, thin_threshold
from swarm.types import LayerRange, SwarmView

# A flow move must raise the swarm's max flow by flow_move_gain: MOVER_SHARE_GAIN times the
# mover's share of the swarm's capacity, within [FLOW_MOVE_GAIN_FLOOR, FLOW_MOVE_GAIN]. A move
# costs the mover's own share for its reload (20-120 s); a gain of four times that share, held for
# the next hour, repays it many times over. A fixed 1% (the cap) was unreachable at 1,000 peers, where
# one peer is ~0.1% of the swarm: no flow move was ever made without churn (68.6% of the bound).
# Twice the share (thirteenth session) let small gains spend the move budget; four times, with the
# shorter cooldown below, makes fewer moves that each lift more: +1.2 points of sum(c) / L at 1,000
# peers and +2.0 at 200 (twenty-first session). The floor keeps a move's gain ten times above the
# flow's tolerance, so every move is real. Measured in the simulator (docs/balancing.md).
FLOW_MOVE_GAIN = 0.01
FLOW_MOVE_GAIN_FLOOR = 0.0005
MOVER_SHARE_GAIN = 4.0
# The max flow a flow move must beat is computed this exactly (routing.flow.flow_and_bottleneck):
# at most this share below the true one, so a move passing the check raises the true flow by at
# least FLOW_MOVE_GAIN_FLOOR - FLOW_TOLERANCE.
FLOW_TOLERANCE = FLOW_MOVE_GAIN_FLOOR / 10
# A peer that moved (for any reason) less than this long ago makes no flow move. Without it
# flow moves went 1.1-1.4 per peer-hour at 200 peers (the budget is 1): a departure shifts the
# bottleneck, and the same peers chased it. One hour kept the fixed 1% gain at 0.8-0.9; the
# scaled gain lets small peers move for less, and at one hour reached 1.03 per peer-hour and an
# 8-s gap on one 200-peer seed of 12. 75 minutes: 0.62-0.90 and no gap over 2 s, the same flow at
# 1,000 peers (thirteenth session). 45 minutes at twice the share went over the budget (1.12 at 200
# peers, 1.08 at 1,000); at four times the share (MOVER_SHARE_GAIN) 0.65-1.03 at 200 peers and
# 0.86-0.99 at 1,000, as high as 75 minutes reached (1.05) (docs/balancing.md, twenty-first session).
FLOW_MOVE_COOLDOWN_S = 2700.0
# A flow move that does not reach its aim must at least cut what the swarm lacks there by
# this share: a real step each time (the shortfall falls geometrically), never a move that shaves a
# little off for the mover's whole reload. Halving (0.5) left resting 200-peer swarms where a flat
# bottom has many stretches locked at 64-69% of sum(c) / L (no one move halves it); a fifth lifts
# them to 95.5-96.6% and gains 1.7 points at 3%/h churn (a tenth: the same, with more moves at 3%/h).
# Measured in the simulator (docs/balancing.md, twenty-eighth session).
SHORTFALL_CUT = 0.2


def flow_move_gain(my_capacity: float, swarm_capacity: float, share_gain: float = MOVER_SHARE_GAIN) -> float:
    """The share by which a flow move of a peer with `my_capacity` (of `swarm_capacity` in all,
    layer-tokens/s) must raise the swarm's max flow: `share_gain` times its share, clamped (see
    MOVER_SHARE_GAIN; the simulator passes another multiple to replay an earlier rule)."""
    if swarm_capacity <= 0:
        return FLOW_MOVE_GAIN
    return min(FLOW_MOVE_GAIN, max(FLOW_MOVE_GAIN_FLOOR, share_gain * my_capacity / swarm_capacity))


def swarm_flow(placement: list[tuple[LayerRange, float]], num_layers: int,
               greedy: Greedy | None = None) -> tuple[float, int | None]:
    """(max flow to FLOW_TOLERANCE, bottleneck layer) of a whole placement: what flow moves must beat.
    `greedy`: the placement's routing.flow.Greedy when the caller has prepared it."""
    return flow_and_bottleneck(placement, num_layers, FLOW_TOLERANCE, greedy)


def plan_flow_move(
    others: list[tuple[LayerRange, float]],
    num_layers: int,
    current: LayerRange,
    my_capacity: float,
    tier_throughput: Sequence[float],
    others_online: Sequence[int],
    others_staying: Sequence[float] | None = None,
    thin_limit: float = 0.0,
    flow: tuple[float, int | None] | None = None,
    gain: float | None = None,
    tier_crossing: Sequence[float] | None = None,
    search: bool = True,
) -> LayerRange | None:
    """Where a peer serving `current` should move for the max flow, or None to stay.

    `others` is the placement ((layers, layer-tokens/s), balanced_placement) without this peer;
    `tier_throughput` the per-layer throughput of its tier without it (layer_throughput's
    min_layers), which ranks the windows as a join does; `others_online` /
    `others_staying` / `thin_limit` as in plan_move. `flow` is swarm_flow of the whole placement,
    this peer included: every peer reading one view shares it (a simulator caches it), computed
    here when not given. The aim is that flow `gain` higher (default flow_move_gain of this peer's
    share). `tier_crossing` (layer_view.crossing_throughput of the tier without this peer) ranks the
    windows as a join's are ranked (routing.balance's staggered windows). `search` False: the rule
    before the twenty-eighth session (the lowest-total window holding the bottleneck, if it alone
    reaches the aim), kept for the simulator's comparisons.
    """
    if not leaves_safely(current, others_online, others_staying, thin_limit):
        return None
    whole = [*others, (current, my_capacity)]
    # Others' placement prepared once: every window this peer is tried in is one more peer on it.
    without_me = Greedy(others, num_layers)
    as_now = without_me.with_peer(current, my_capacity)
    now, bottleneck = flow or swarm_flow(whole, num_layers, as_now)
    if bottleneck is None or now <= 0:
        return None  # a gap comes first (should_move)
    if gain is None:
        gain = flow_move_gain(my_capacity, sum(c for _, c in whole))
    aim = now * (1 + gain)
    if not search:
        if current.start <= bottleneck < current.end:
            return None
        target = window_holding(tier_throughput, len(current), bottleneck, tier_crossing)
        return target if without_me.with_peer(target, my_capacity).carries(aim) else None
    lacking = as_now.feed(aim, stop_at_first=False, track_unused=False)
    if lacking.first_short is None:
        return None  # within the flow's tolerance of the aim already
    best = _least_lacking_window(without_me, len(current), my_capacity, aim, lacking.first_short,
                                 tier_throughput, tier_crossing, current)
    if best is None or best[1] > (1 - SHORTFALL_CUT) * lacking.shortfall:
        return None
    if not without_me.with_peer(best[0], my_capacity).carries(now):
        return None  # it would cut the shortfall by taking flow from elsewhere
    return best[0]


def _least_lacking_window(others: Greedy, k: int, my_capacity: float,
                          aim: float, short_layer: int, tier_throughput: Sequence[float],
                          tier_crossing: Sequence[float] | None,
                          current: LayerRange) -> tuple[LayerRange, float] | None:
    """(window, shortfall at `aim` with this peer there) of the windows of k layers holding `short_layer`
    other than `current`, `others` the placement without this peer: the least shortfall, then the lowest
    window_total, then the lowest start."""
    best: tuple[tuple[float, float, int], LayerRange] | None = None
    for start in range(max(0, short_layer - k + 1), min(short_layer, others.num_layers - k) + 1):
        window = LayerRange(start, start + k)
        if window == current:
            continue
        left = others.with_peer(window, my_capacity).feed(aim, stop_at_first=False, track_unused=False).shortfall
        key = (left, window_total(tier_throughput, start, k, tier_crossing), start)
        if best is None or key < best[0]:
            best = (key, window)
    return None if best is None else (best[1], best[0][0])


def mover_in(view: SwarmView, me: str, my_throughput: float | None = None) -> tuple[LayerRange, float]:
    """(layers, layer-tokens/s) of peer `me` in the view (its record's throughput, or `my_throughput`),
    its layers clipped to the model: what a move decision weighs it at."""
    record = view.records.get(me)
    if record is None:
        raise ValueError(f"peer {me!r} is not in the view of model {view.model}")
    current = LayerRange(min(record.layers.start, view.num_layers - 1), min(record.layers.end, view.num_layers))
    throughput = record.throughput if my_throughput is None else my_throughput
    return current, len(current) * max(throughput, 0.0)


def view_flow(view: SwarmView, me: str, my_throughput: float | None = None) -> tuple[float, int | None]:
    """swarm_flow of the view's placement with peer `me` weighed as mover_in: computed once, it serves
    both the move gate (routing.move_gate) and flow_move at one balance check."""
    current, capacity = mover_in(view, me, my_throughput)
    return swarm_flow([*balanced_placement(view, without=me), (current, capacity)], view.num_layers)


def flow_move(view: SwarmView, me: str, *, since_last_move_s: float | None,
              my_throughput: float | None = None, search: bool = True,
              flow: tuple[float, int | None] | None = None) -> LayerRange | None:
    """plan_flow_move on a view, for peer `me` whose last move was `since_last_move_s` ago (None: never);
    `search` False: the rule before (plan_flow_move); `flow`: view_flow of the same view and
    throughput when already computed.

    Call it when should_move says stay: a move for strengths comes first.
    """
    current, capacity = mover_in(view, me, my_throughput)
    if since_last_move_s is not None and since_last_move_s < FLOW_MOVE_COOLDOWN_S:
        return None
    return plan_flow_move(
        balanced_placement(view, without=me),
        view.num_layers,
        current,
        capacity,
        layer_throughput(view, without=me, min_layers=len(current)),
        layer_servers(view, without=me),
        staying_throughput(view, without=me),
        thin_threshold(view),
        flow=flow,
        tier_crossing=crossing_throughput(view, without=me, min_layers=len(current)),
        search=search,
    )
