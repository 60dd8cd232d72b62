"""routing.move_gate: a strength move found at a periodic check goes only when it gives a lone layer a
second server or raises the swarm's max flow."""

from __future__ import annotations

from routing import (
    GATE_MARGIN,
    BalanceDecision,
    MoveKind,
    balance_check,
    flow_move,
    max_flow_throughput,
    should_move,
    strength_move_pays,
    strength_move_pays_in,
    view_flow,
)
from routing.flow_move import swarm_flow
from routing.layer_view import balanced_placement, layer_counts
from swarm.types import LayerRange, PeerRecord
from tests.routing_helpers import rec, view

SMALL = (rec("g", "4:6", 20.0), rec("h", "6:8", 20.0))


def _swarm(*small: PeerRecord):
    # 4-layer peers: a, b and i on 0:4, two slow ones on 4:8, two on 8:12. `a` weighs only its tier (4
    # layers or more), where 4:8 is weakest (5 tokens/s against 16 on 0:4 without it): should_move sends
    # it there.
    return view(12, rec("a", "0:4", 8.0), rec("b", "0:4", 8.0), rec("i", "0:4", 8.0), rec("c", "4:8", 2.5),
                rec("d", "4:8", 2.5), rec("e", "8:12", 5.0), rec("f", "8:12", 5.0), *small)


def _moved(v, target: LayerRange):
    return view(v.num_layers, rec("a", str(target), 8.0), *(r for r in v.records.values() if r.peer_id != "a"))


def test_a_strength_move_that_leaves_the_max_flow_where_it_was_is_held() -> None:
    # Two 2-layer peers make 4:8 strong (25 tokens/s), which a's tier does not see: the flow runs dry
    # on 8:12 (10), where a's move changes nothing.
    v = _swarm(*SMALL)
    target = should_move(v, "a")
    assert target == LayerRange(4, 8)
    assert max_flow_throughput(_moved(v, target)) <= max_flow_throughput(v)
    assert not strength_move_pays_in(v, "a", target)
    # The balancer computes the swarm's max flow once and hands it to the gate and to flow_move.
    flow = view_flow(v, "a")
    assert flow == swarm_flow(balanced_placement(v), 12)
    assert not strength_move_pays_in(v, "a", target, flow_now=flow[0])
    assert flow_move(v, "a", since_last_move_s=None, flow=flow) == flow_move(v, "a", since_last_move_s=None)


def test_a_strength_move_that_raises_the_max_flow_goes() -> None:
    v = _swarm()  # without the 2-layer peers 4:8 is the bottleneck (5), and a's move lifts the flow to 10
    target = should_move(v, "a")
    assert target == LayerRange(4, 8)
    assert max_flow_throughput(_moved(v, target)) > max_flow_throughput(v) * (1 + GATE_MARGIN)
    assert strength_move_pays_in(v, "a", target)


def test_a_strength_move_that_gives_a_lone_layer_a_second_server_goes_whatever_the_flow() -> None:
    # The first swarm, where a's move leaves the max flow as it was, but with one server on layer 5: a
    # layer one crash from dark gets a second, which the max flow does not see.
    v = _swarm(*SMALL)
    others, counts = balanced_placement(v, without="a"), layer_counts(v)
    flow_now, _ = swarm_flow(balanced_placement(v), 12)
    assert not strength_move_pays(others, 12, LayerRange(0, 4), LayerRange(4, 8), 32.0, counts, flow_now)
    counts[5] = 1
    assert strength_move_pays(others, 12, LayerRange(0, 4), LayerRange(4, 8), 32.0, counts, flow_now)
    # A lone layer the mover serves now is no layer the move gives a second server: it does not count.
    counts[5], counts[3] = 2, 1
    assert not strength_move_pays(others, 12, LayerRange(0, 4), LayerRange(2, 6), 32.0, counts, flow_now)


def test_the_whole_check_gates_periodic_strength_moves_and_falls_back_to_a_flow_move() -> None:
    held = _swarm(*SMALL)  # a's strength move leaves the max flow where it was (first test)
    check = balance_check(held, "a", since_last_move_s=None, periodic=True)
    assert check.held == LayerRange(4, 8)
    assert check.target == flow_move(held, "a", since_last_move_s=None)
    assert check.kind is (MoveKind.STAY if check.target is None else MoveKind.FLOW)
    # A reaction to a hole is not gated; a peer that just moved makes no flow move.
    assert balance_check(held, "a", since_last_move_s=None, periodic=False) == BalanceDecision(
        MoveKind.STRENGTH, LayerRange(4, 8))
    assert balance_check(held, "a", since_last_move_s=60.0, periodic=True) == BalanceDecision(
        MoveKind.STAY, None, LayerRange(4, 8))
    # The move that raises the flow goes at a periodic check too.
    assert balance_check(_swarm(), "a", since_last_move_s=None, periodic=True) == BalanceDecision(
        MoveKind.STRENGTH, LayerRange(4, 8))
