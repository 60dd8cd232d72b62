"""Whether a strength move found at a periodic balance check is worth its reload.

should_move (routing/balance.py) moves a peer when the weakest strength of the layers it touches
grows by 1/quality. Most such moves shuffle throughput between layers that two or more peers serve
and leave what the swarm carries where it was: the max flow (routing/flow.py) runs dry elsewhere.
Each costs the mover's capacity for its reload (half a minute for 16 layers from disk) and one move
of the budget of one per peer-hour. So at a periodic check a strength move goes only when it

* gives a second server to a layer of its target that has at most one (redundancy, which the max
  flow does not see: routing.balance's SOLE_DISCOUNT), or
* raises the swarm's max flow by more than GATE_MARGIN.

A peer reacting to a gap or a thin layer (a departure's hole) moves as before: those moves refill.
The moves left out are a third of the periodic ones; flow moves that search every window
(routing.flow_move) spend the budget they free on the stretches where the flow does run dry.
Measured in the simulator, 2x, 10%/h churn (docs/balancing.md, twenty-ninth session).
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.flow import max_flow_of
from routing.flow_move import FLOW_TOLERANCE, mover_in, swarm_flow
from routing.layer_view import balanced_placement, layer_counts
from swarm.types import LayerRange, SwarmView

# The max flow must rise by more than this share for a strength move to go on flow alone: twenty
# times the max flow's tolerance (flow_move.FLOW_TOLERANCE, 0.005%), so a move that pays is a real
# gain, and of the order of what a flow move must bring (four times its mover's share, 0.05-1%).
# Measured only at this value.
GATE_MARGIN = 0.001


def strength_move_pays(others: list[tuple[LayerRange, float]], num_layers: int, current: LayerRange,
                       target: LayerRange, my_capacity: float, servers: Sequence[int], flow_now: float) -> bool:
    """Does a strength move from `current` to `target` pay (module docstring)?

    `others`: the placement without this peer ((layers, layer-tokens/s), layer_view.balanced_placement);
    `servers`: per-layer counts of the servers balancing counts on (layer_view.layer_counts, this peer
    included); `flow_now`: the max flow of the whole placement (flow_move.swarm_flow), this peer at
    `current`; `my_capacity`: its layer-tokens/s.
    """
    if seconds_a_lone_layer(current, target, servers):
        return True
    after = max_flow_of([*others, (target, my_capacity)], num_layers, FLOW_TOLERANCE)  # swarm_flow's, no bottleneck
    return after > flow_now * (1 + GATE_MARGIN)


def seconds_a_lone_layer(current: LayerRange, target: LayerRange, servers: Sequence[int]) -> bool:
    """Does a move from `current` to `target` give a second server to a layer that has at most one
    (`servers`: per-layer counts, the mover included)?"""
    return any(servers[layer] <= 1 for layer in range(target.start, target.end) if not current.start <= layer < current.end)


def strength_move_pays_in(view: SwarmView, me: str, target: LayerRange, my_throughput: float | None = None,
                          flow_now: float | None = None) -> bool:
    """strength_move_pays on a view, for peer `me` (its record's layers and throughput, or `my_throughput`);
    `flow_now`: flow_move.view_flow's flow of the same view and throughput when already computed."""
    current, capacity = mover_in(view, me, my_throughput)
    others = balanced_placement(view, without=me)
    if flow_now is None:
        flow_now, _ = swarm_flow([*others, (current, capacity)], view.num_layers)
    return strength_move_pays(others, view.num_layers, current, target, capacity, layer_counts(view), flow_now)
