"""routing.flow_move: a running peer moves to where the max flow runs dry, when that raises it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing import (
    FLOW_MOVE_COOLDOWN_S,
    FLOW_MOVE_GAIN,
    flow_move,
    layer_servers,
    layer_throughput,
    max_flow_throughput,
    plan_flow_move,
    should_move,
)
from routing.balance import balanced_placement
from routing.flow import BOTTLENECK_TOLERANCE
from swarm.types import LayerRange
from tests.routing_helpers import joined_swarm, rec, settle, view


def _swarm():
    # 0:4 has two fast 4-layer peers and c on 1:5; 5:8 only d. Max flow 10.7 of a bound 14:
    # the flow runs dry on 4:8, where c's 16 layer-tokens/s must feed layer 4 and d's 32 the rest.
    return view(8, rec("a", "0:4", 8.0), rec("b", "0:4", 8.0), rec("c", "1:5", 4.0), rec("d", "4:8", 8.0))


def test_a_peer_the_strength_rule_keeps_moves_where_the_max_flow_runs_dry() -> None:
    v = _swarm()
    assert should_move(v, "a") is None and should_move(v, "a", quality=1.0) is None
    assert flow_move(v, "a", since_last_move_s=None) == LayerRange(4, 8)
    moved = view(8, rec("a", "4:8", 8.0), *(r for r in v.records.values() if r.peer_id != "a"))
    assert max_flow_throughput(moved) > max_flow_throughput(v) * (1 + FLOW_MOVE_GAIN)  # 12 vs 10.7
    # Further flow moves (the bottleneck is in 0:4 now) each raise the flow again, and stop.
    for _ in range(8):
        target = flow_move(moved, "a", since_last_move_s=None)
        if target is None:
            break
        again = view(8, rec("a", str(target), 8.0), *(r for r in v.records.values() if r.peer_id != "a"))
        assert max_flow_throughput(again) > max_flow_throughput(moved) * (1 + FLOW_MOVE_GAIN) * (1 - BOTTLENECK_TOLERANCE)
        moved = again
    else:
        raise AssertionError("a kept moving")


def test_a_flow_move_waits_for_the_cooldown_and_leaves_nothing_dark_or_thin() -> None:
    v = _swarm()
    assert flow_move(v, "a", since_last_move_s=FLOW_MOVE_COOLDOWN_S / 2) is None
    assert flow_move(v, "a", since_last_move_s=FLOW_MOVE_COOLDOWN_S) == LayerRange(4, 8)
    assert flow_move(v, "d", since_last_move_s=None) is None  # the only server of 5:8
    # b would raise the max flow by shifting to 4:8 (layer 7 has only c's 2 tokens/s), but while it
    # reloads 4:7 keeps c alone, under half the mean layer throughput (8): b stays. The same move
    # without that check (plan_flow_move without others_staying) would go.
    shifting = view(8, rec("a", "2:4", 8.0), rec("b", "3:7", 8.0), rec("c", "0:8", 2.0))
    assert flow_move(shifting, "b", since_last_move_s=None) is None
    others = balanced_placement(shifting, without="b")
    tier, online = layer_throughput(shifting, without="b", min_layers=4), layer_servers(shifting, without="b")
    assert plan_flow_move(others, 8, LayerRange(3, 7), 32.0, tier, online) == LayerRange(4, 8)
    with pytest.raises(ValueError):
        flow_move(v, "ghost", since_last_move_s=None)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 2, 4]), st.sampled_from([1.0, 2.5, 6.0])), min_size=2, max_size=9),
       st.randoms(use_true_random=False))
def test_flow_moves_raise_the_max_flow_uncover_nothing_and_stop(peers, rng) -> None:
    def move_checked(before, peer_id):
        target = flow_move(before, peer_id, since_last_move_s=None)
        if target is not None:
            moved = dict(before.records)
            moved[peer_id] = rec(peer_id, str(target), before.records[peer_id].throughput)
            after = view(10, *moved.values())
            assert min(layer_servers(after)) >= min(1, min(layer_servers(before)))  # no layer uncovered
            gain = (1 + FLOW_MOVE_GAIN) * (1 - BOTTLENECK_TOLERANCE)
            assert max_flow_throughput(after) >= gain * max_flow_throughput(before) * (1 - 1e-6)
        return target

    settle(joined_swarm(peers, 10), 10, move_checked, rng)
