"""choose_layers / should_move on hand-made swarms, plus properties of plan_move."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing import (
    choose_layers,
    choose_window,
    covered_without,
    gaps_opened_since,
    incoming,
    layer_counts,
    layer_servers,
    layer_throughput,
    may_move,
    plan_move,
    plan_route,
    possible_takers,
    should_move,
    standby_layers,
    standby_window,
    strengths,
    thin_layers,
    thin_without,
    urgent_layers,
)
from routing.balance import STAGGER_WEIGHT, stagger_weights, window_total
from routing.flow import bottleneck_layer, max_flow_throughput, peer_capacities
from routing.layer_view import crossing_throughput, guarded_layers
from swarm.types import LayerRange, PeerRecord, PeerState
from tests.routing_helpers import joined_swarm, rec, settle, view

J, OFF = PeerState.JOINING, PeerState.OFFLINE


def test_layer_throughput_counts_online_and_joining_but_servers_only_online() -> None:
    v = view(4, rec("a", "0:2", 2.0), rec("j", "1:3", 5.0, state=J), rec("o", "0:4", 9.0, state=OFF))
    assert layer_throughput(v) == [2.0, 7.0, 5.0, 0.0]
    assert layer_throughput(v, without="j") == [2.0, 2.0, 0.0, 0.0]
    assert layer_servers(v) == [1, 1, 0, 0]


def test_choose_layers_on_an_empty_swarm_starts_at_zero() -> None:
    assert choose_layers(view(10), 4) == LayerRange(0, 4)
    assert choose_layers(view(10), 25) == LayerRange(0, 10)  # more memory than the model


def test_choose_layers_covers_the_most_uncovered_layers() -> None:
    v = view(10, rec("a", "0:3", 5.0), rec("b", "5:7", 5.0))
    assert choose_layers(v, 2) == LayerRange(3, 5)
    assert choose_layers(v, 3) == LayerRange(7, 10)  # 3 gaps at 7:10 beat 2 at 3:5
    assert choose_layers(v, 5) == LayerRange(3, 8)  # 3:5 and 7 uncovered (3 gaps), lower load than 5:10
    assert choose_layers(view(10, rec("a", "2:8")), 2) == LayerRange(0, 2)  # tie: lowest start


def test_choose_layers_goes_to_the_thin_spot() -> None:
    v = view(8, rec("a", "0:8", 10.0), rec("b", "0:3", 10.0), rec("c", "5:8", 3.0))
    # Throughput per layer: 20 20 20 10 10 13 13 13 -> the minimum is at 3-4.
    assert layer_throughput(v) == [20, 20, 20, 10, 10, 13, 13, 13]
    thr, counts = layer_throughput(v), layer_counts(v)
    assert choose_window(thr, 2, counts) == LayerRange(3, 5)
    assert choose_window(thr, 3, counts) == LayerRange(3, 6)  # contains the minimum, lowest total
    assert choose_window([5.0, 1.0, 5.0, 1.0, 5.0], 1) == LayerRange(1, 2)  # tie: lowest start


def test_choose_window_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        choose_window([], 3)
    with pytest.raises(ValueError):
        choose_window([1.0], 0)


def test_should_move_to_a_much_thinner_spot() -> None:
    v = view(8, rec("a", "0:4", 10.0), rec("b", "0:4", 10.0), rec("c", "4:8", 1.0))
    # Without b: 10 on 0:4, 1 on 4:8. Local bottleneck 1 now, 10 after: move.
    assert should_move(v, "b") == LayerRange(4, 8)
    assert should_move(v, "a") == LayerRange(4, 8)
    assert should_move(v, "c") is None  # c is the only server of 4:8


def test_should_move_into_uncovered_layers() -> None:
    v = view(8, rec("a", "0:4", 1.0), rec("b", "0:4", 1.0))
    assert should_move(v, "b") == LayerRange(4, 8)


def test_should_not_move_if_that_would_uncover_a_layer() -> None:
    v = view(8, rec("a", "0:4", 10.0), rec("c", "4:8", 1.0))
    assert should_move(v, "a") is None
    # A JOINING peer on 0:4 does not count: it serves no one yet.
    v = view(8, rec("a", "0:4", 10.0), rec("j", "0:4", 10.0, state=J), rec("c", "4:8", 1.0))
    assert should_move(v, "a") is None


def test_a_sole_server_stays_even_when_its_target_keeps_that_layer() -> None:
    # a is the only server of layers 4 and 5; its best range 4:8 keeps them, but a peer whose
    # memory holds only its own range stops serving while it loads: 4:6 would go dark.
    v = view(10, rec("a", "2:6", 10.0), rec("b", "0:4", 10.0), rec("c", "6:10", 0.5))
    assert should_move(v, "a") is None
    covered = view(10, rec("a", "2:6", 10.0), rec("b", "0:4", 10.0), rec("d", "4:6", 10.0), rec("c", "6:10", 0.5))
    assert should_move(covered, "a") == LayerRange(4, 8)  # d (2 layers, another tier) keeps 4:6 served


def test_a_sole_server_shifts_into_a_gap_only_it_can_fill_while_the_swarm_is_down() -> None:
    # The GPU test's sequence: m moved to 14:29 (sole server of layer 14), then the peer of 0:15
    # crashed. Layers 0:14 have no server, so no route exists: m may vacate layer 14 for the load,
    # since its target 0:15 takes it back. Before, it stayed, and the gap stayed for good.
    down = view(30, rec("m", "14:29", 10.0), rec("s", "15:30", 10.0))
    assert should_move(down, "m") == LayerRange(0, 15)
    assert may_move(down, "m", LayerRange(14, 29), LayerRange(0, 15))
    assert not may_move(down, "m", LayerRange(14, 29), LayerRange(15, 30))  # would leave 14 dark for good
    # A standby serving the gap keeps the swarm up: vacating layer 14 would open a real gap.
    up = view(30, rec("m", "14:29", 10.0), rec("s", "15:30", 10.0), replace(rec("sb", "0:14", 0.1), standby=True))
    assert not may_move(up, "m", LayerRange(14, 29), LayerRange(0, 15))
    assert should_move(up, "m") is None


def test_a_gap_at_the_models_end_is_left_to_the_peer_that_closes_it_in_one_move() -> None:
    # A real swarm's sequence (tests/test_balancer.py, 1 run of 8 under load): b moved 10:20 -> 9:19
    # before v, the sole server of 20:30, crashed. d, now the only server of layer 19, sees 19:30
    # dark. Taking 19:29 (the lowest window) left layer 29 dark, which only a second move of d
    # itself could reach, and it is then the only server of 19:29: the swarm stayed down. From the
    # end of the run d's candidate 20:30 would leave its own layer 19 dark, so d stays, and b,
    # whose layers f and d keep covered, takes 20:30 in one move.
    down = view(30, rec("f", "0:10"), rec("b", "9:19"), rec("d", "10:20"))
    assert should_move(down, "d") is None
    assert should_move(down, "b") == LayerRange(20, 30)
    # A gap at the model's start still takes the lowest window.
    assert should_move(view(30, rec("d", "10:20"), rec("e", "10:20"), rec("g", "20:30")), "d") == LayerRange(0, 10)
    # Only while the swarm is down (plan_move's swarm_down), and only for runs of k+1 to 2k-1 layers:
    # a longer run (an empty swarm filling up) keeps the lowest window.
    throughput, servers = [1.0] * 19 + [0.0] * 11, [1] * 19 + [0] * 11
    assert choose_window(throughput, 10, servers) == LayerRange(19, 29)
    assert choose_window(throughput, 10, servers, gap_end_first=True) == LayerRange(20, 30)
    assert choose_window([1.0] * 10 + [0.0] * 20, 10, [1] * 10 + [0] * 20, gap_end_first=True) == LayerRange(10, 20)


def test_a_move_steps_back_when_a_layer_lost_its_last_server_after_the_decision() -> None:
    # CI's sequence (tests/test_balancer.py): b decided a move 10:20 -> 9:19 while the view still
    # listed v, the crashed sole server of 20:30; by the confirmation the crash watch had dropped v.
    decided = view(30, rec("f", "0:10"), rec("b", "10:20"), rec("d", "10:20"), rec("v", "20:30"))
    now = view(30, rec("f", "0:10"), rec("b", "10:20"), rec("d", "10:20"))
    assert may_move(now, "b", LayerRange(10, 20), LayerRange(9, 19))  # b's own layers stay covered by d ...
    assert gaps_opened_since(decided, now, "b", LayerRange(9, 19)) == list(range(20, 30))  # ... but 20:30 went dark
    assert gaps_opened_since(decided, now, "b", LayerRange(20, 30)) == []  # a move that fills them goes on
    assert gaps_opened_since(now, now, "b", LayerRange(9, 19)) == []  # nothing changed: go
    # A gap the decision already saw is no reason to step back: the move was weighed with it.
    assert gaps_opened_since(now, now, "d", LayerRange(0, 10)) == []
    # Nor is a layer whose last server is the mover itself (may_move judges its own layers).
    alone = view(30, rec("f", "0:10"), rec("b", "10:20"), rec("v", "20:30"))
    assert gaps_opened_since(alone, alone, "b", LayerRange(20, 30)) == []


def test_a_peer_weighs_only_peers_at_least_its_size() -> None:
    # Big peers (4 layers) hold 0:4 twice; small ones (2 layers) crowd 4:8. A big peer lays
    # the base where no big peer is, though 4:8 is busier than 0:4 counting everyone; the
    # small ones weigh everyone and patch the thin spot 0:4.
    crowd = [rec(f"s{i}", f"{4 + 2 * (i % 2)}:{6 + 2 * (i % 2)}", 10.0) for i in range(6)]
    v = view(8, rec("b1", "0:4", 5.0), rec("b2", "0:4", 5.0), *crowd)
    assert layer_throughput(v) == [10.0] * 4 + [30.0] * 4
    assert layer_throughput(v, min_layers=4) == [10.0] * 4 + [0.0] * 4
    assert choose_window(layer_throughput(v, min_layers=4), 4, layer_counts(v)) == LayerRange(4, 8)
    assert choose_window(layer_throughput(v), 4, layer_counts(v)) == LayerRange(0, 4)  # everyone weighed
    assert should_move(v, "b2") is None  # b1 alone would leave 0:4 thin (5 of a mean 20)
    assert should_move(v, "s0") == LayerRange(0, 2)  # 10 now, 20 after: more than 1.33x
    # With a third big peer 0:4 keeps 14 of a mean 25.5 without b2, and b2 lays the base at 4:8.
    based = view(8, *(rec(f"b{i}", "0:4", 7.0) for i in (1, 2, 3)), *crowd)
    assert should_move(based, "b2") == LayerRange(4, 8)
    assert choose_layers(v, 2) == LayerRange(2, 4)  # the max flow runs dry at layer 3


def test_real_gaps_come_before_layers_only_smaller_peers_hold() -> None:
    # For a 3-layer peer, 0:3 (held by a 2-layer peer only) looks empty; 5:8 is really empty.
    v = view(8, rec("small", "0:2", 1.0), rec("big", "2:5", 1.0))
    assert layer_throughput(v, min_layers=3) == [0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert choose_layers(v, 3) == LayerRange(5, 8)
    assert choose_layers(view(8, rec("small", "0:2", 1.0), rec("big", "2:8", 1.0)), 3) == LayerRange(0, 3)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 2, 4]), st.sampled_from([1.0, 2.5, 6.0])), min_size=2, max_size=9),
       st.randoms(use_true_random=False))
def test_balancing_a_fixed_swarm_stops_moving(peers, rng) -> None:
    # Tiers make each size balance against larger ones; smaller peers change only the
    # redundancy counts bigger ones see. However they interleave, the moves must end.
    settle(joined_swarm(peers, 10), 10, should_move, rng)


def test_should_not_move_for_a_small_gain() -> None:
    v = view(8, rec("a", "0:4", 10.0), rec("b", "0:4", 2.0), rec("c", "4:8", 9.0))
    # Without b: 10 | 9. Local bottleneck 9 now, min(10, 11) = 10 after: only 1.11x.
    assert should_move(v, "b") is None
    assert should_move(v, "b", quality=1.0) == LayerRange(4, 8)  # any strict gain
    # The throughput rule alone (no server counts): 6 now, min(10, 8) = 8 after: 1.33x is not more.
    others, online, current = [10.0] * 4 + [6.0] * 4, [1] * 8, LayerRange(0, 4)
    assert plan_move(others, online, current, 2.0) is None
    assert plan_move(others, online, current, 6.0) == LayerRange(4, 8)  # 6 -> min(10, 12)
    with pytest.raises(ValueError):
        should_move(v, "b", quality=0.0)


def test_should_move_stays_when_already_in_the_best_place() -> None:
    v = view(8, rec("a", "0:4", 10.0), rec("b", "4:8", 10.0))
    assert should_move(v, "a") is None and should_move(v, "b") is None


def test_should_move_unknown_peer() -> None:
    with pytest.raises(ValueError, match="not in the view"):
        should_move(view(4), "ghost")


def test_balance_is_independent_of_record_order() -> None:
    rng = random.Random(7)
    records = [rec(f"p{i}", f"{s}:{s + rng.randint(1, 5)}", rng.choice([1.0, 2.5, 7.0])) for i, s in
               enumerate(rng.randrange(15) for _ in range(12))]
    shuffled = records[:]
    rng.shuffle(shuffled)
    a, b = view(20, *records), view(20, *shuffled)
    assert layer_throughput(a) == layer_throughput(b)
    assert choose_layers(a, 4) == choose_layers(b, 4)
    assert [should_move(a, r.peer_id) for r in records] == [should_move(b, r.peer_id) for r in records]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.5, 8.0]), min_size=2, max_size=12),
    st.integers(0, 11),
    st.integers(1, 6),
    st.sampled_from([0.5, 1.0, 4.0]),
    st.sampled_from([0.5, 0.75, 1.0]),
)
def test_plan_move_never_lowers_the_bottleneck_nor_uncovers(others, s, k, mine, quality) -> None:
    n = len(others)
    current = LayerRange(min(s, n - 1), min(s, n - 1) + min(k, n - min(s, n - 1)))
    online = [1 if x > 0 else 0 for x in others]
    target = plan_move(others, online, current, mine, quality)
    before = [x + (mine if i in current else 0) for i, x in enumerate(others)]
    if target is None:
        return
    assert len(target) == len(current) and target != current
    after = [x + (mine if i in target else 0) for i, x in enumerate(others)]
    assert min(after) >= min(before)
    assert sorted(after) > sorted(before)  # leximin strictly improves: no move cycles
    assert all(online[i] > 0 for i in range(current.start, current.end))  # each layer it pauses has another server


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.0, 1.0, 2.0, 3.5]), min_size=1, max_size=16), st.integers(1, 6))
def test_choose_window_matches_brute_force_ranking(throughput, k) -> None:
    k = min(k, len(throughput))
    windows = [throughput[s : s + k] for s in range(len(throughput) - k + 1)]
    best = min(range(len(windows)), key=lambda s: (-windows[s].count(0.0), min(windows[s]), sum(windows[s]), s))
    assert choose_window(throughput, k) == LayerRange(best, best + k)


def test_choose_layers_joins_where_the_max_flow_is_short_not_at_the_weakest_layer() -> None:
    # Two parts: 0:4 held by a and b (20 layer-tokens/s: max flow 20 / 4 = 5); 4:8 by c (4:6),
    # d (4:8) and e (6:8), which carry 5.75 together. The weakest layers by strength are 6:8
    # (4.5 tokens/s), but capacity there leaves the max flow at 5: the bottleneck is in 0:4.
    both = [rec("a", "0:4", 2.5), rec("b", "0:4", 2.5), rec("c", "4:6", 3.0), rec("d", "4:8", 4.0),
            rec("e", "6:8", 0.5)]
    v = view(8, *both)
    assert max_flow_throughput(v) == pytest.approx(5.0)
    assert bottleneck_layer(peer_capacities(v), 8) == 3
    assert choose_window(layer_throughput(v), 2, layer_counts(v)) == LayerRange(6, 8)
    # Of the windows holding layer 3, 2:4 is the weakest and abuts c and d at 4; 3:5 straddles that
    # boundary, which no window crosses (staggered windows), and carries more: the new peer's
    # capacity can feed either side of it.
    assert choose_window(layer_throughput(v), 2, layer_counts(v), bottleneck=3) == LayerRange(2, 4)
    assert choose_layers(v, 2) == LayerRange(3, 5)

    def flow_with(layers: str) -> float:
        return max_flow_throughput(view(8, *both, rec("new", layers, 5.0)))

    assert flow_with("3:5") > flow_with("2:4") > flow_with("6:8") == pytest.approx(5.0)  # 6.6 > 5.75 > 5
    # Redundancy first: when the weakest window holds a layer with one server, it wins.
    sole = view(8, rec("a", "0:4", 5.0), rec("c", "4:6", 3.0), rec("d", "4:8", 4.0))
    assert choose_layers(sole, 2) == LayerRange(6, 8)
    # With a gap, the gap comes first.
    assert choose_layers(view(8, rec("a", "0:4", 5.0), rec("c", "4:6", 3.0)), 2) == LayerRange(6, 8)


def test_crossing_throughput_counts_the_windows_that_straddle_each_boundary() -> None:
    v = view(8, rec("a", "0:4", 2.0), rec("j", "2:6", 5.0, state=J), rec("o", "0:8", 9.0, state=OFF),
             rec("big", "0:8", 1.0))
    # Boundary b lies before layer b: a crosses 1-3, j (joining) 3-5, big 1-7, o (offline) none.
    assert crossing_throughput(v) == [0.0, 3.0, 3.0, 8.0, 6.0, 6.0, 1.0, 1.0]
    assert crossing_throughput(v, without="j") == [0.0, 3.0, 3.0, 3.0, 1.0, 1.0, 1.0, 1.0]
    assert crossing_throughput(v, min_layers=8) == [0.0] + [1.0] * 7  # the tier of 8-layer windows


def crossing_of(placement: list[tuple[str, float]], num_layers: int) -> list[float]:
    """crossing_throughput of ONLINE peers on `placement` ((layers, throughput) each)."""
    return crossing_throughput(view(num_layers, *(rec(f"p{i}", layers, thr) for i, (layers, thr) in enumerate(placement))))


def test_staggered_windows_straddle_the_boundaries_few_windows_cross() -> None:
    # Four abutting windows of 4 over 16 layers; 4:12 (b, c) are the weakest, equally so: without
    # crossings the lowest start among the weakest windows wins, abutting again.
    placed = [("0:4", 20.0), ("4:8", 10.0), ("8:12", 10.0), ("12:16", 20.0)]
    v = view(16, *(rec(name, layers, thr) for name, (layers, thr) in zip("abcd", placed)))
    thr, counts, crossing = layer_throughput(v), layer_counts(v), crossing_of(placed, 16)
    assert crossing[4] == crossing[8] == 0.0 and crossing[5] == 10.0
    assert choose_window(thr, 4, counts) == LayerRange(4, 8)
    # Counting the throughput crossing each window's inner boundaries, the windows straddling 8
    # (crossed by nobody) win over 4:8 (crossed by b at 5, 6, 7); weighed by a tent, the one that puts
    # 8 in its middle wins over those straddling it by one layer: 6:10 overlaps b and c by half each.
    assert stagger_weights(4) == (1.0, 2.0, 1.0)
    assert window_total(thr, 6, 4, crossing) == 40.0 + STAGGER_WEIGHT * (10.0 + 0.0 + 10.0)
    assert window_total(thr, 5, 4, crossing) == window_total(thr, 7, 4, crossing) == 40.0 + STAGGER_WEIGHT * 30.0
    assert choose_window(thr, 4, counts, crossing=crossing) == LayerRange(6, 10) == choose_layers(v, 4)
    # With every boundary weighed alike, the three straddles of 8 would tie (lowest start: 5:9).
    assert sum(crossing[6:9]) == sum(crossing[7:10]) == sum(crossing[8:11])
    # A window at either end of the model counts its layers alone: its end layers have no other
    # window that could hold them (staggered away, they would lose a server).
    ones = [1.0] * 16
    assert window_total(ones, 0, 4, crossing) == window_total(ones, 12, 4, crossing) == 4.0
    assert window_total(ones, 2, 4, crossing) == 4.0 + STAGGER_WEIGHT * 30.0  # a (20) at 3, b (10) at 5
    weak_start = [("0:4", 6.0), *placed[1:]]
    v = view(16, *(rec(name, layers, thr) for name, (layers, thr) in zip("abcd", weak_start)))
    assert choose_window(layer_throughput(v), 4, layer_counts(v), crossing=crossing_of(weak_start, 16)) == LayerRange(0, 4)


def test_a_straddle_never_leaves_a_one_server_layer_the_abutting_window_would_double() -> None:
    # b alone holds 4:8 (strength 15, the weakest); every other layer has two servers. Ranked with
    # crossings alone, 2:6 wins (the boundary at 4, which nobody crosses, in its middle), but it would
    # give a second server to two of b's layers where 4:8 gives one to all four: the joiner takes 4:8.
    v = view(16, rec("a", "0:4", 10.0), rec("a2", "0:4", 10.0), rec("b", "4:8", 30.0), rec("c", "8:12", 10.0),
             rec("e", "8:12", 10.0), rec("d", "12:16", 10.0), rec("d2", "12:16", 10.0))
    thr, counts, crossing = layer_throughput(v), layer_counts(v), crossing_throughput(v)
    ranked = strengths(thr, counts)
    assert min(range(1, 5), key=lambda s: window_total(ranked, s, 4, crossing)) == 2
    assert choose_window(thr, 4, counts, crossing=crossing) == LayerRange(4, 8) == choose_layers(v, 4)


def test_a_sole_served_layer_counts_at_half_its_throughput() -> None:
    # 0:4 has two servers (20 tokens/s), 4:8 one faster one (30, strength 15): 4:8 is weaker.
    v = view(8, rec("a", "0:4", 10.0), rec("b", "0:4", 10.0), rec("fast", "4:8", 30.0))
    assert layer_counts(v) == [2, 2, 2, 2, 1, 1, 1, 1]
    assert strengths(layer_throughput(v), layer_counts(v)) == [20.0] * 4 + [15.0] * 4
    assert choose_window(layer_throughput(v), 4, layer_counts(v)) == LayerRange(4, 8)
    assert choose_window(layer_throughput(v), 4) == LayerRange(0, 4)  # throughput alone
    # b moving there would leave 0:4 sole-served at 10 x 1/2 = 5, weaker than 15: it stays.
    assert should_move(v, "b") is None
    v = view(8, rec("a", "0:4", 30.0), rec("b", "0:4", 30.0), rec("fast", "4:8", 20.0))
    # Now: min(60, 10) = 10; after b moves: min(30 / 2, 50) = 15 > 10 / 0.75: move.
    assert should_move(v, "b") == LayerRange(4, 8)


def test_a_sole_served_layer_a_standby_guards_counts_in_full() -> None:
    # As above, but a standby guards 4:8: its sole server's crash would leave it slow, not dark.
    standby = replace(rec("s", "4:8", 0.5), standby=True)
    v = view(8, rec("a", "0:4", 10.0), rec("b", "0:4", 10.0), rec("fast", "4:8", 30.0), standby)
    assert guarded_layers(v) == [False] * 4 + [True] * 4
    guarded = guarded_layers(v)
    assert strengths(layer_throughput(v), layer_counts(v), guarded=guarded) == [20.0] * 4 + [30.0] * 4
    assert choose_window(layer_throughput(v), 4, layer_counts(v), guarded=guarded) == LayerRange(0, 4)
    assert choose_layers(v, 4) == LayerRange(0, 4)  # unguarded, 4:8 (strength 15) would win
    # A loading standby guards its target already (as balancing counts loading peers), a moving one
    # its target; an OFFLINE one nothing.
    assert guarded_layers(view(8, replace(rec("s", "0:2", state=J), standby=True))) == [True] * 2 + [False] * 6
    assert guarded_layers(view(8, replace(rec("s", "0:2", state=OFF), standby=True))) == [False] * 8
    moving = replace(rec("s", "0:4"), standby=True, moving_to=LayerRange(2, 6))
    assert guarded_layers(view(8, moving)) == [False] * 2 + [True] * 4 + [False] * 2


def test_thin_layers_are_urgent_and_hold_a_drain_while_a_replacement_loads() -> None:
    D = PeerState.DRAINING
    # Mean layer throughput of the counted peers 6.5: 4:8 with its slow server alone is thin.
    v = view(8, rec("a", "0:4", 12.0), rec("slow", "4:8", 1.0), rec("me", "4:8", 10.0))
    assert thin_layers(v) == [] and urgent_layers(v) == []
    assert thin_layers(v, without="me") == [4, 5, 6, 7] and thin_without(v, "me")
    assert not thin_without(v, "slow") and not thin_without(v, "ghost")  # me alone carries 4:8 well
    draining = view(8, rec("a", "0:4", 12.0), rec("slow", "4:8", 1.0), rec("me", "4:8", 10.0, state=D))
    assert urgent_layers(draining) == [4, 5, 6, 7]  # covered, but thin: others decide at once
    assert should_move(draining, "a") is None  # 0:4 has no other server: a stays all the same
    # Who is loading there: a JOINING peer on it, a mover whose target overlaps; not one elsewhere.
    loading = view(8, rec("me", "4:8", state=D), rec("j", "6:8", state=J), rec("k", "0:2", state=J),
                   replace(rec("m", "0:2"), moving_to=LayerRange(3, 5)), replace(rec("s", "4:8", state=J), standby=True))
    assert incoming(loading, "me") == ["j", "m"] and incoming(loading, "ghost") == []


def test_a_peer_does_not_move_away_from_layers_it_would_leave_thin() -> None:
    # 4:8 has one slow server (strength 1 x SOLE_DISCOUNT). Without "a", 0:4 keeps b alone (2
    # tokens/s), under THIN_SHARE of the mean 6.5 (3.25): the move's reload would halve the swarm's
    # flow there for as long as the dip it closes on 4:8. Coverage alone (b stays) would allow it.
    alone = view(8, rec("a", "0:4", 10.0), rec("b", "0:4", 2.0), rec("c", "4:8", 1.0))
    assert should_move(alone, "a") is None
    assert should_move(alone, "a", quality=1.0) is None
    # A third server keeps 0:4 at 5 without a (limit 8 x 1/2 = 4): then a moves.
    backed = view(8, rec("a", "0:4", 10.0), rec("b", "0:4", 2.0), rec("b2", "0:4", 3.0), rec("c", "4:8", 1.0))
    assert should_move(backed, "a") == LayerRange(4, 8)
    # The array form: the same rule through others_staying / thin_limit, and none without them.
    others, online = [2.0] * 4 + [1.0] * 4, [1] * 8
    assert plan_move(others, online, LayerRange(0, 4), 10.0, others_counted=online) == LayerRange(4, 8)
    assert plan_move(others, online, LayerRange(0, 4), 10.0, others_counted=online,
                     others_staying=others, thin_limit=3.25) is None


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([0.0, 1.0, 2.0, 3.5, 8.0]), st.integers(0, 3)), min_size=2, max_size=12),
    st.integers(0, 11),
    st.integers(1, 6),
    st.sampled_from([0.5, 1.0, 4.0]),
    st.sampled_from([0.5, 0.75, 1.0]),
)
def test_moves_with_counts_improve_the_sorted_strengths(layers, s, k, mine, quality) -> None:
    others = [thr if count else 0.0 for thr, count in layers]
    counted = [count if thr else 0 for thr, count in layers]
    n = len(others)
    current = LayerRange(min(s, n - 1), min(s, n - 1) + min(k, n - min(s, n - 1)))
    target = plan_move(others, counted, current, mine, quality, counted)
    if target is None:
        return

    def placed(r: LayerRange) -> list[float]:
        return sorted(strengths([others[i] + (mine if i in r else 0.0) for i in range(n)],
                                [counted[i] + (i in r) for i in range(n)]))

    assert placed(target) > placed(current)  # strictly better: moves cannot cycle
    assert min(placed(target)) >= min(placed(current))
    assert all(counted[i] > 0 for i in range(current.start, current.end) if i not in target)  # nothing uncovered


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1.0, 2.0, 3.5]), st.integers(1, 3)), min_size=1, max_size=16),
       st.integers(1, 6))
def test_choose_window_with_counts_ranks_strengths(layers, k) -> None:
    throughput = [t for t, _ in layers]
    servers = [c for _, c in layers]
    k = min(k, len(throughput))
    assert choose_window(throughput, k, servers) == choose_window(strengths(throughput, servers), k)


def test_drain_helpers_name_urgent_layers_coverage_and_takers() -> None:
    D = PeerState.DRAINING
    v = view(8, rec("a", "0:4"), rec("b", "0:4"), rec("d", "4:8", state=D), rec("f", "0:8", state=OFF))
    assert urgent_layers(v) == [4, 5, 6, 7]  # only a draining peer serves them
    assert not covered_without(v, "d")
    assert possible_takers(v, "d") == ["a", "b"]  # each may leave 0:4 to the other
    assert covered_without(v, "a") and covered_without(v, "ghost")
    alone = view(8, rec("a", "0:4"), rec("d", "4:8", state=D))
    assert possible_takers(alone, "d") == []  # a is 0:4's only server: nobody can come
    assert possible_takers(view(8, rec("a", "0:4"), rec("j", "0:2", state=J), rec("d", "4:8", state=D)), "d") == ["j"]
    # Draining peers do not count in balancing: their layers look empty to movers.
    assert layer_throughput(v)[4:] == [0.0] * 4 and layer_counts(v)[4:] == [0] * 4
    assert should_move(v, "b") == LayerRange(4, 8)
    assert should_move(alone, "a") is None


def test_a_moving_peer_counts_at_its_target_but_serves_its_old_layers() -> None:
    # m moves from 0:4 to 2:6 and still serves 0:4 until its swap.
    mover = replace(rec("m", "0:4", 5.0), moving_to=LayerRange(2, 6))
    v = view(8, mover, rec("a", "0:2", 1.0), rec("b", "6:8", 1.0))
    assert layer_throughput(v) == [1.0, 1.0, 5.0, 5.0, 5.0, 5.0, 1.0, 1.0]  # balancing: at its target
    assert layer_counts(v) == [1] * 8
    assert layer_servers(v) == [1, 1, 1, 1, 0, 0, 1, 1]  # a staying server only of 2:4, the layers it keeps
    assert v.uncovered_layers() == [4, 5]  # it covers 0:4 now; 4:6 only once loaded
    # 4:6 has no server yet; 0:2 and 6:8 are thin (1 tokens/s, under THIN_SHARE of the mean 3).
    assert thin_layers(v) == [0, 1, 4, 5, 6, 7] and urgent_layers(v) == [0, 1, 4, 5, 6, 7]
    assert mover.last_resort and not rec("a", "0:2").last_resort
    assert PeerRecord.from_dict(mover.to_dict()) == mover  # survives the wire
    assert "moving_to" not in rec("a", "0:2").to_dict()  # absent unless moving, as older peers write
    # a may leave 0:2 only if another peer keeps serving it: the mover leaves those layers.
    assert not covered_without(v, "a")
    assert possible_takers(v, "a") == ["m"]
    # Two peers on 2:4 decide at once to leave it: once both announced, neither is covered.
    both = view(8, replace(rec("x", "2:4"), moving_to=LayerRange(4, 6)), rec("y", "6:8", state=J),
                rec("z", "0:2"))
    assert not covered_without(both, "x") and not covered_without(both, "y", LayerRange(2, 4))
    assert covered_without(both, "y", LayerRange(0, 2))


def test_routes_avoid_a_moving_peer_where_another_serves() -> None:
    # Sessions on a mover fail over at its swap: like a draining peer, a last resort.
    mover = replace(rec("m", "0:4", 50.0), moving_to=LayerRange(4, 8))
    v = view(8, mover, rec("slow", "0:4", 1.0), rec("b", "4:8", 1.0))
    assert [h.peer_id for h in plan_route(v)] == ["slow", "b"]
    alone = view(8, mover, rec("b", "4:8", 1.0))
    assert [h.peer_id for h in plan_route(alone)] == ["m", "b"]


def test_a_standby_guards_the_layers_one_crash_would_leave_dark() -> None:
    # 0:4 has two servers; 4:8 only b; 8:10 only c.
    swarm = [rec("a1", "0:4", 5.0), rec("a2", "0:4", 5.0), rec("b", "4:8", 5.0), rec("c", "8:10", 5.0)]
    v = view(10, *swarm)
    assert standby_layers(v, "s", 4) == LayerRange(4, 8)  # four sole-served layers beat 8:10's two
    assert standby_layers(v, "s", 6) == LayerRange(4, 10)
    # Once there it stays; a second standby guards what is left.
    s1 = replace(rec("s", "4:8", 0.1), standby=True)
    v = view(10, *swarm, s1)
    assert standby_layers(v, "s", 4) is None
    assert standby_layers(v, "t", 2) == LayerRange(8, 10)
    # Nothing exposed: a standby starts where the fewest standbys are, and then stays put.
    safe = view(6, rec("a", "0:6"), rec("b", "0:6"), replace(rec("s", "0:2", 0.1), standby=True))
    assert standby_layers(safe, "t", 2) == LayerRange(2, 4)
    assert standby_layers(safe, "s", 2) is None
    # When b crashes its layers are dark: a standby elsewhere moves, by more than the margin.
    v = view(10, rec("a1", "0:4"), rec("a2", "0:4"), rec("c", "8:10"), replace(rec("s", "8:10", 0.1), standby=True))
    assert standby_window(layer_servers(v), [0] * 10, 2, LayerRange(8, 10)) == LayerRange(4, 6)
    # A standby never guards the layers of a peer on its own machine: one crash takes both.
    host = {"b": "10.0.0.2", "s": "10.0.0.2", "a1": "10.0.0.1"}
    assert standby_layers(view(10, *swarm), "s", 4, host) == LayerRange(6, 10)
    loading = view(10, rec("a1", "0:4"), rec("a2", "0:4"), rec("b", "4:8", state=J), rec("c", "8:10"))
    assert standby_layers(loading, "s", 4) == LayerRange(4, 8)  # a gap, unless its loader is our machine
    assert standby_layers(loading, "s", 4, host) == LayerRange(6, 10)
    # Nor does a standby sitting on its own machine's layers count as their guard for others.
    beside_host = replace(rec("s", "4:8", 0.1), standby=True)
    assert standby_layers(view(10, *swarm, beside_host), "t", 4, host) == LayerRange(4, 8)
    # A standby that alone serves a layer (its server crashed) stays, even for a better place.
    gap = view(10, rec("a1", "0:4"), rec("c", "8:10"), replace(rec("s", "4:6", 0.1), standby=True))
    assert standby_layers(gap, "s", 2) is None
    assert standby_window([0, 0, 0, 1, 1], [0] * 5, 1, LayerRange(4, 5)) == LayerRange(0, 1)
    # ... and does not move for one more exposed layer than it guards now.
    assert standby_window([2, 1, 1, 1, 2, 1, 1], [0] * 7, 2, LayerRange(5, 7)) is None


def test_others_ignore_a_standby_except_where_nothing_else_serves() -> None:
    standby = replace(rec("s", "0:4", 0.5), standby=True)
    v = view(4, rec("a", "0:4", 10.0), standby)
    # Balancing: no throughput, no count, no staying server (it is no capacity and may move).
    assert layer_throughput(v) == [10.0] * 4 and layer_counts(v) == [1] * 4 and layer_servers(v) == [1] * 4
    assert possible_takers(v, "a") == []
    assert PeerRecord.from_dict(standby.to_dict()) == standby and standby.last_resort
    # Routing: a faster-looking standby is still used last; coverage counts it.
    fast = replace(rec("s", "0:4", 100.0), standby=True)
    assert [h.peer_id for h in plan_route(view(4, rec("a", "0:4", 1.0), fast))] == ["a"]
    crashed = view(4, fast)
    assert [h.peer_id for h in plan_route(crashed)] == ["s"] and crashed.uncovered_layers() == []
    assert urgent_layers(crashed) == [0, 1, 2, 3]  # full-speed peers should still refill it
