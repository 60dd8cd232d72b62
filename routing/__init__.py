"""Pure routing and balancing algorithms over a SwarmView (no I/O, no threads, no torch).

Every function here is deterministic: equal inputs give equal outputs, ties included.
Only `swarm.types` is imported from the rest of the project.

- costs.py   RouteCosts, hop_cost: what one hop of a route costs in seconds per token.
- route.py   plan_route, route_cost, NoRouteError: the fastest chain of serving peers
             covering a span of layers (shortest path over layer boundaries).
- bans.py    BanList: peers that failed recently, exponential backoff; its penalties()
             feed plan_route(banned=...).
- balance.py layer_throughput, layer_counts, layer_servers, choose_layers (flow-aware), should_move,
             urgent_layers, thin_layers, covered_without, may_move, thin_without, incoming,
             possible_takers (array-level forms: choose_window, plan_move): which layers a
             peer should serve (sole-served layers discounted unless a standby guards them);
             when to decide at once (gaps, thin layers); when an announced move may go on (a
             swarm that is down lets a sole server shift into the gap); when a draining peer may leave
             (helpers shared with flow_move.py: leaves_safely, window_holding, balanced_placement).
- flow_move.py flow_move (array-level: plan_flow_move): a running peer moves to where the
             max flow runs dry when that raises it by FLOW_MOVE_GAIN, at most once per
             FLOW_MOVE_COOLDOWN_S (after should_move says stay).
- standby.py standby_layers (standby_window, exposure): where a standby guards the layers one
             crash would leave dark; standby_load_order (load_order): in which order a loading
             standby should fetch and serve them, the exposed ones first, one growing range.
- spread.py  choose_route, sample_route, flow_weights: a busy swarm's sessions spread over
             parallel routes by spare capacity, near the max flow (fastest route while it has room).
- flow.py    max_flow_throughput, capacity_bound: the most tokens/s a placement can serve
             (exact max flow on the layer graph), the optimum placement and routing aim at;
             bottleneck_layer / flow_and_bottleneck: where it runs dry (joins and flow moves go there).
"""

from routing.balance import (
    DEFAULT_QUALITY,
    SOLE_DISCOUNT,
    THIN_SHARE,
    choose_layers,
    choose_window,
    covered_without,
    exposes_on_leaving,
    incoming,
    layer_counts,
    layer_servers,
    layer_throughput,
    may_move,
    plan_move,
    possible_takers,
    should_move,
    strengths,
    thin_layers,
    thin_without,
    urgent_layers,
)
from routing.bans import BAN_BASE_S, BAN_CAP_S, BAN_FACTOR, BanList
from routing.costs import RouteCosts, hop_cost
from routing.flow import capacity_bound, max_flow_throughput
from routing.flow_move import FLOW_MOVE_COOLDOWN_S, FLOW_MOVE_GAIN, flow_move, plan_flow_move
from routing.route import NoRouteError, plan_route, route_cost
from routing.spread import choose_route, sample_route
from routing.standby import load_order, standby_layers, standby_load_order, standby_window

__all__ = [
    "BAN_BASE_S",
    "BAN_CAP_S",
    "BAN_FACTOR",
    "DEFAULT_QUALITY",
    "FLOW_MOVE_COOLDOWN_S",
    "FLOW_MOVE_GAIN",
    "SOLE_DISCOUNT",
    "THIN_SHARE",
    "BanList",
    "NoRouteError",
    "RouteCosts",
    "choose_layers",
    "choose_route",
    "choose_window",
    "covered_without",
    "exposes_on_leaving",
    "may_move",
    "capacity_bound",
    "flow_move",
    "hop_cost",
    "incoming",
    "layer_counts",
    "layer_servers",
    "layer_throughput",
    "load_order",
    "max_flow_throughput",
    "plan_flow_move",
    "plan_move",
    "plan_route",
    "possible_takers",
    "route_cost",
    "sample_route",
    "should_move",
    "standby_layers",
    "standby_load_order",
    "standby_window",
    "strengths",
    "thin_layers",
    "thin_without",
    "urgent_layers",
]
