"""routing.flow_move: a running peer moves to where the max flow runs dry, when that cuts what the swarm lacks
for a higher flow (or, the rule before, raises it there in one move)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing import (
    FLOW_MOVE_COOLDOWN_S,
    FLOW_MOVE_GAIN,
    FLOW_MOVE_GAIN_FLOOR,
    flow_move,
    flow_move_gain,
    layer_servers,
    layer_throughput,
    max_flow_throughput,
    plan_flow_move,
    should_move,
)
from routing.flow import capacity_bound, feed_greedily, peer_capacities
from routing.flow_move import FLOW_TOLERANCE, MOVER_SHARE_GAIN, SHORTFALL_CUT
from routing.layer_view import balanced_placement
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
        assert max_flow_throughput(again) > max_flow_throughput(moved) * (1 + FLOW_MOVE_GAIN) * (1 - FLOW_TOLERANCE)
        moved = again
    else:
        raise AssertionError("a kept moving")


def test_the_gain_a_flow_move_needs_scales_with_the_movers_share() -> None:
    assert flow_move_gain(1.0, 10.0) == FLOW_MOVE_GAIN  # a tenth of the swarm: the cap
    assert flow_move_gain(1.0, 1000.0) == pytest.approx(MOVER_SHARE_GAIN * 0.001)  # a multiple of its share
    assert flow_move_gain(1.0, 1e6) == FLOW_MOVE_GAIN_FLOOR
    assert FLOW_MOVE_GAIN_FLOOR >= 10 * FLOW_TOLERANCE  # a move that passes raises the true flow
    # A big swarm: layers 4:8 hold 199 tokens/s, 0:4 201 (a among them), 8:16 a surplus of fast peers.
    # a (0.077% of the capacity) moving to 4:8 raises the max flow by 0.5%: more than its gain (0.31%),
    # less than a fixed 1%, which at 1,000 peers no move ever reached (docs/balancing.md).
    records = [rec("a", "0:4", 1.0), *(rec(f"p{i}", "0:4", 2.0) for i in range(100)),
               rec("q", "4:8", 1.0), *(rec(f"r{i}", "4:8", 2.0) for i in range(99)),
               *(rec(f"s{i}", "8:12", 100.0) for i in range(3)), *(rec(f"t{i}", "12:16", 200.0) for i in range(3))]
    big = view(16, *records)
    assert flow_move_gain(4.0, capacity_bound(big) * 16) == pytest.approx(MOVER_SHARE_GAIN * 4 / 5200)
    assert flow_move_gain(4.0, capacity_bound(big) * 16) < 0.005 < FLOW_MOVE_GAIN
    target = flow_move(big, "a", since_last_move_s=None)
    assert target == LayerRange(5, 9)  # holds the bottleneck, straddles the boundary at 8 (staggered windows)
    moved = view(16, rec("a", str(target), 1.0), *records[1:])
    assert max_flow_throughput(moved) == pytest.approx(max_flow_throughput(big) * 200 / 199)
    others = balanced_placement(big, without="a")
    tier, online = layer_throughput(big, without="a", min_layers=4), layer_servers(big, without="a")
    assert plan_flow_move(others, 16, LayerRange(0, 4), 4.0, tier, online, gain=FLOW_MOVE_GAIN) is None


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
def test_flow_moves_of_the_rule_before_raise_the_max_flow_uncover_nothing_and_stop(peers, rng) -> None:
    def move_checked(before, peer_id):
        target = flow_move(before, peer_id, since_last_move_s=None, search=False)
        if target is not None:
            moved = dict(before.records)
            moved[peer_id] = rec(peer_id, str(target), before.records[peer_id].throughput)
            after = view(10, *moved.values())
            assert min(layer_servers(after)) >= min(1, min(layer_servers(before)))  # no layer uncovered
            mine = len(before.records[peer_id].layers) * before.records[peer_id].throughput
            gain = (1 + flow_move_gain(mine, capacity_bound(before) * 10)) * (1 - FLOW_TOLERANCE)
            assert max_flow_throughput(after) >= gain * max_flow_throughput(before) * (1 - 1e-6)
        return target

    settle(joined_swarm(peers, 10), 10, move_checked, rng)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 2, 4]), st.sampled_from([1.0, 2.5, 6.0])), min_size=2, max_size=9),
       st.randoms(use_true_random=False))
def test_flow_moves_keep_the_flow_cut_the_shortfall_uncover_nothing_and_stop(peers, rng) -> None:
    def move_checked(before, peer_id):
        target = flow_move(before, peer_id, since_last_move_s=None)
        if target is not None:
            moved = dict(before.records)
            moved[peer_id] = rec(peer_id, str(target), before.records[peer_id].throughput)
            after = view(10, *moved.values())
            assert min(layer_servers(after)) >= min(1, min(layer_servers(before)))  # no layer uncovered
            now = max_flow_throughput(before)
            assert max_flow_throughput(after) >= now * (1 - FLOW_TOLERANCE)  # the flow never falls
            mine = len(before.records[peer_id].layers) * before.records[peer_id].throughput
            aim = now * (1 + flow_move_gain(mine, capacity_bound(before) * 10))
            lacking_before = feed_greedily(peer_capacities(before), 10, aim).shortfall
            lacking_after = feed_greedily(peer_capacities(after), 10, aim).shortfall
            assert lacking_after <= (1 - SHORTFALL_CUT) * lacking_before + 1e-9 * aim
        return target

    settle(joined_swarm(peers, 10), 10, move_checked, rng)


def test_flow_moves_lift_a_flat_bottom_one_stretch_at_a_time() -> None:
    # Tiles of 12 and 10 tokens/s; 2:5 and 8:9 carry 10, the rest 12, so the max flow is 10 on two
    # separate stretches (a flat bottom). m and n (3 layers, 4 tokens/s) add spare capacity to 5:8
    # and 9:12. No one move lifts both stretches, so the rule before (the aim in one move) moves nobody.
    records = [rec("w1", "0:2", 12.0), rec("w2", "2:5", 10.0), rec("w3", "5:8", 12.0), rec("w4", "8:9", 10.0),
               rec("w5", "9:12", 12.0), rec("m", "5:8", 4.0), rec("n", "9:12", 4.0)]
    flat = view(12, *records)
    assert max_flow_throughput(flat) == pytest.approx(10.0)
    assert all(flow_move(flat, peer_id, since_last_move_s=None, search=False) is None for peer_id in flat.records)
    # m covers the first stretch: the flow stays (8:9 still binds), what the swarm lacks at the aim
    # at least halves.
    aim = 10.0 * (1 + flow_move_gain(12.0, capacity_bound(flat) * 12))
    target = flow_move(flat, "m", since_last_move_s=None)
    assert target is not None and target.start < 5  # on the first stretch, where the greedy runs short first
    first = view(12, rec("m", str(target), 4.0), *records[:5], records[6])
    assert max_flow_throughput(first) == pytest.approx(10.0)
    lacking = feed_greedily(peer_capacities(first), 12, aim).shortfall
    assert lacking <= 0.5 * feed_greedily(peer_capacities(flat), 12, aim).shortfall  # one stretch of two lifted
    # n then covers the other one, and the flow rises by a fifth.
    target = flow_move(first, "n", since_last_move_s=None)
    assert target is not None and target.start <= 8 < target.end
    second = view(12, rec("n", str(target), 4.0), *(r for r in first.records.values() if r.peer_id != "n"))
    assert max_flow_throughput(second) == pytest.approx(12.0)
