"""Pure routing and balancing algorithms over a SwarmView (no I/O, no threads, no torch).

Every function here is deterministic: equal inputs give equal outputs, ties included.
Only `swarm.types` is imported from the rest of the project.

- costs.py   RouteCosts, hop_cost: what one hop of a route costs in seconds per token.
- route.py   plan_route, route_cost, NoRouteError: the fastest chain of serving peers
             covering a span of layers (shortest path over layer boundaries).
- bans.py    BanList: peers that failed recently, exponential backoff; its penalties()
             feed plan_route(banned=...).
- balance.py choose_layers (flow-aware), should_move (array-level forms: choose_window,
             plan_move): which layers a peer should serve (sole-served layers discounted
             unless a standby guards them; windows staggered: window_total counts the
             throughput crossing their inner boundaries, most in the middle, stagger_weights).
- layer_view.py layer_throughput, crossing_throughput, layer_counts, layer_servers, staying_throughput,
             guarded_layers, balanced_placement: what each layer holds, as balancing, moves and
             drains count it.
- leaving.py urgent_layers, thin_layers, covered_without, may_move, gaps_opened_since, thin_without, incoming,
             possible_takers, exposes_on_leaving, leaves_safely: when to decide at once (gaps,
             thin layers); when a move may start or go on (a swarm that is down lets a sole
             server shift into the gap); when a draining peer may leave; who reacts a step later.
- flow_move.py flow_move (array-level: plan_flow_move): a running peer moves to the window where
             the max flow runs dry that cuts by SHORTFALL_CUT what the swarm lacks for a rise of
             flow_move_gain (its capacity share, x4, within 0.05-1%), at most once per
             FLOW_MOVE_COOLDOWN_S (after should_move says stay, or its move does not pay);
             swarm_flow: the one max flow per view those checks share (on a view: view_flow).
- balance_check.py balance_check (BalanceDecision, MoveKind): a GPU peer's whole balance check,
             should_move gated by strength_move_pays_in at a periodic check, else flow_move, one
             max flow shared (a reaction decides on downloads.as_reactions_count's view): what peer/balancer.py acts on.
- downloads.py as_reactions_count: a reaction counts a loader that downloads its layers (its record's
             `downloading`), where its target holds a layer no GPU peer serves, only on the layers it serves:
             the disk loaders refill the rest instead of waiting on the network's pace.
- move_gate.py strength_move_pays (on a view: strength_move_pays_in): a strength move found at a
             periodic check goes only when it gives a layer with at most one server a second or
             raises the swarm's max flow by GATE_MARGIN (reactions to holes are not gated).
- standby.py standby_layers (standby_window, exposure): where a standby guards the layers one
             crash would leave dark; standby_load_order (load_order): in which order a loading
             standby should fetch and serve them, the exposed ones first, one growing range.
- move_order.py move_load_order: in which order a moving GPU peer that serves each layer as it
             arrives loads its target: layers no GPU peer serves first (gap_weight: less where
             another loader's announced order brings them sooner, first_arrivals), then the thinnest.
- spread.py  choose_route, sample_route, flow_weights: a busy swarm's sessions spread over
             parallel routes by spare capacity, near the max flow (fastest route while it has room).
- flow.py    max_flow_throughput, capacity_bound: the most tokens/s a placement can serve
             (exact max flow on the layer graph), the optimum placement and routing aim at;
             bottleneck_layer / flow_and_bottleneck: where it runs dry (joins and flow moves go there);
             feed_greedily: what a placement lacks for a flow, and which windows end with capacity unused.
             Greedy: one placement prepared for many flows, grown by one peer (a flow move's windows).
"""

from routing.balance import (
    DEFAULT_QUALITY,
    SOLE_DISCOUNT,
    choose_layers,
    choose_window,
    plan_move,
    should_move,
    strengths,
)
from routing.balance_check import BalanceDecision, MoveKind, balance_check
from routing.bans import BAN_BASE_S, BAN_CAP_S, BAN_FACTOR, BanList
from routing.costs import RouteCosts, hop_cost
from routing.flow import capacity_bound, max_flow_throughput
from routing.flow_move import (
    FLOW_MOVE_COOLDOWN_S,
    FLOW_MOVE_GAIN,
    FLOW_MOVE_GAIN_FLOOR,
    flow_move,
    flow_move_gain,
    plan_flow_move,
    swarm_flow,
    view_flow,
)
from routing.layer_view import layer_counts, layer_servers, layer_throughput
from routing.leaving import (
    THIN_SHARE,
    covered_without,
    exposes_on_leaving,
    gaps_opened_since,
    incoming,
    may_move,
    possible_takers,
    thin_layers,
    thin_without,
    urgent_layers,
)
from routing.move_gate import GATE_MARGIN, strength_move_pays, strength_move_pays_in
from routing.move_order import first_arrivals, gap_weight, move_load_order
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
    "FLOW_MOVE_GAIN_FLOOR",
    "GATE_MARGIN",
    "SOLE_DISCOUNT",
    "THIN_SHARE",
    "BalanceDecision",
    "BanList",
    "MoveKind",
    "NoRouteError",
    "RouteCosts",
    "choose_layers",
    "choose_route",
    "choose_window",
    "covered_without",
    "exposes_on_leaving",
    "may_move",
    "balance_check",
    "capacity_bound",
    "flow_move",
    "flow_move_gain",
    "gaps_opened_since",
    "hop_cost",
    "incoming",
    "layer_counts",
    "layer_servers",
    "layer_throughput",
    "load_order",
    "max_flow_throughput",
    "move_load_order",
    "first_arrivals",
    "gap_weight",
    "plan_flow_move",
    "swarm_flow",
    "plan_move",
    "plan_route",
    "possible_takers",
    "route_cost",
    "sample_route",
    "should_move",
    "standby_layers",
    "standby_load_order",
    "standby_window",
    "strength_move_pays",
    "strength_move_pays_in",
    "strengths",
    "thin_layers",
    "thin_without",
    "urgent_layers",
    "view_flow",
]
