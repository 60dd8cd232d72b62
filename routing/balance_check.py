"""A GPU peer's whole balance check on one view: the decision peer/balancer.py acts on.

In order: should_move (a move for per-layer strengths); at a periodic check, not a reaction to a
hole, that move must pay for its reload (move_gate.strength_move_pays_in); when there is none, or it
does not pay, flow_move (where the swarm's max flow runs dry, at most once per FLOW_MOVE_COOLDOWN_S).
A reaction counts a downloading loader on dark layers only where it serves (downloads.as_reactions_count).
The gate and the flow move share one max flow (flow_move.view_flow). One call, so that the time a
peer spends deciding is measured as the peer spends it (benchmarks/sim_decisions.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from routing.balance import DEFAULT_QUALITY, should_move
from routing.downloads import as_reactions_count
from routing.flow_move import flow_move, view_flow
from routing.move_gate import strength_move_pays_in
from swarm.types import LayerRange, SwarmView


class MoveKind(Enum):
    """Which rule chose a balance check's move (the balancer logs flow moves, and forces one in tests)."""

    STAY = "stay"
    STRENGTH = "strength"  # should_move's target (gated at a periodic check)
    FLOW = "flow"  # flow_move's target


@dataclass(frozen=True)
class BalanceDecision:
    """balance_check's answer."""

    kind: MoveKind
    target: LayerRange | None  # where to move (None: stay)
    held: LayerRange | None = None  # a strength move the gate held back: it would not pay for its reload


def balance_check(view: SwarmView, me: str, *, since_last_move_s: float | None, periodic: bool,
                  my_throughput: float | None = None, quality: float = DEFAULT_QUALITY) -> BalanceDecision:
    """What peer `me` (in `view`'s records) should do at a balance check.

    `since_last_move_s`: seconds since its last move (None: never); `periodic`: a check at its balance
    period (False: woken by gaps or thin layers, whose strength moves refill and are not gated);
    `my_throughput`: its measured throughput (default: its record's); `quality`: should_move's.
    """
    if not periodic:
        view = as_reactions_count(view, me)  # a download's dark layers still to come stay dark to a reaction
    target = should_move(view, me, quality=quality, my_throughput=my_throughput)
    flow = None
    held = None
    if target is not None and periodic:
        flow = view_flow(view, me, my_throughput)
        if not strength_move_pays_in(view, me, target, my_throughput, flow_now=flow[0]):
            target, held = None, target
    if target is not None:
        return BalanceDecision(MoveKind.STRENGTH, target)
    target = flow_move(view, me, since_last_move_s=since_last_move_s, my_throughput=my_throughput, flow=flow)
    return BalanceDecision(MoveKind.STAY if target is None else MoveKind.FLOW, target, held)
