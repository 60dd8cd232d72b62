"""plan_route on hand-made swarms: exact hops, gaps, bans, exclusions, ties, pages, speed."""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing import NoRouteError, RouteCosts, hop_cost, plan_route, route_cost
from swarm.types import LayerRange, PeerRecord, PeerState, SwarmView
from tests.routing_helpers import hops, rec, view

FREE = RouteCosts(default_rtt=0.0, hop_overhead=0.0)  # pure compute, for exact tie cases


def test_hop_cost_is_rtt_plus_overhead_plus_share_of_compute() -> None:
    r = rec("a", "0:10", throughput=5.0, free_pages=3)
    costs = RouteCosts(default_rtt=0.05, hop_overhead=0.005, low_pages_penalty=10.0)
    assert hop_cost(r, LayerRange(2, 6), 0.02, costs, 0) == pytest.approx(0.02 + 0.005 + 4 / 10 / 5)
    assert hop_cost(r, LayerRange(2, 6), None, costs, 0) == pytest.approx(0.05 + 0.005 + 0.08)
    assert hop_cost(r, LayerRange(2, 6), None, costs, 4) == pytest.approx(10.0 + 0.055 + 0.08)
    assert hop_cost(r, LayerRange(2, 6), None, costs, 3) == pytest.approx(0.055 + 0.08)


def test_single_peer_serves_everything() -> None:
    assert hops(plan_route(view(4, rec("a", "0:4")))) == [("a", "0:4")]


def test_two_fast_halves_beat_one_slow_peer() -> None:
    v = view(8, rec("slow", "0:8", 1.0), rec("left", "0:4", 10.0), rec("right", "4:8", 10.0))
    assert hops(plan_route(v)) == [("left", "0:4"), ("right", "4:8")]


def test_one_fast_peer_beats_two_hops_when_network_dominates() -> None:
    v = view(8, rec("whole", "0:8", 100.0), rec("left", "0:4", 1000.0), rec("right", "4:8", 1000.0))
    assert hops(plan_route(v)) == [("whole", "0:8")]


def test_hops_take_sub_ranges_of_overlapping_peers() -> None:
    # a: 1/(6*6) s per layer; b: 1/(5*5). Cheaper a takes all it can, b only the rest.
    v = view(8, rec("a", "0:6", 6.0), rec("b", "3:8", 5.0))
    assert hops(plan_route(v)) == [("a", "0:6"), ("b", "6:8")]
    # Make b cheaper per layer: now a takes only the layers b lacks.
    v = view(8, rec("a", "0:6", 1.0), rec("b", "3:8", 50.0))
    assert hops(plan_route(v)) == [("a", "0:3"), ("b", "3:8")]


def test_start_and_end_select_a_span() -> None:
    v = view(10, rec("a", "0:10", 1.0), rec("b", "2:6", 100.0))
    assert hops(plan_route(v, start=2, end=6)) == [("b", "2:6")]
    assert hops(plan_route(v, start=5, end=9)) == [("b", "5:6"), ("a", "6:9")]
    assert hops(plan_route(v, start=6, end=9)) == [("a", "6:9")]
    with pytest.raises(ValueError):
        plan_route(v, start=6, end=6)
    with pytest.raises(ValueError):
        plan_route(v, end=11)


def test_measured_rtt_is_used_and_unknown_rtt_gets_the_default() -> None:
    v = view(4, rec("near", "0:4"), rec("far", "0:4"), rec("unknown", "0:4"), rtt={"near": 0.2, "far": 0.01})
    assert hops(plan_route(v)) == [("far", "0:4")]
    assert hops(plan_route(v, costs=RouteCosts(default_rtt=0.001))) == [("unknown", "0:4")]


def test_gap_raises_with_exact_uncovered_layers_and_a_hint() -> None:
    v = view(10, rec("a", "0:4"), rec("b", "6:9"))
    with pytest.raises(NoRouteError) as info:
        plan_route(v)
    assert info.value.uncovered == [4, 5, 9]
    message = str(info.value)
    assert "layers 4-5, 9 of model m" in message
    assert "swarm-peer serve --layers 4:6" in message and "--layers 9:10" in message


def test_only_online_peers_route() -> None:
    v = view(
        6,
        rec("a", "0:3"),
        rec("j", "3:6", state=PeerState.JOINING),
        rec("o", "3:6", state=PeerState.OFFLINE),
    )
    with pytest.raises(NoRouteError) as info:
        plan_route(v)
    assert info.value.uncovered == [3, 4, 5]
    assert "start a peer with `swarm-peer serve --layers 3:6`" in str(info.value)


def test_banned_peer_avoided_when_an_alternative_exists() -> None:
    v = view(4, rec("fast", "0:4", 100.0), rec("slow", "0:4", 0.5))
    assert hops(plan_route(v)) == [("fast", "0:4")]
    assert hops(plan_route(v, banned={"fast": 1.0})) == [("slow", "0:4")]


def test_banned_peer_used_only_where_it_is_the_sole_server() -> None:
    v = view(8, rec("solo", "0:4", 100.0), rec("other", "4:8", 0.5), rec("alt", "4:8", 100.0))
    assert hops(plan_route(v, banned={"solo": 1.0, "alt": 1.0})) == [("solo", "0:4"), ("other", "4:8")]
    # The ban is a cost per hop: once "solo" must carry layers 2-3, one hop through it over
    # its whole range beats adding a hop through an unbanned but slow peer.
    v = view(8, rec("solo", "0:8", 100.0), rec("x", "0:2", 0.5), rec("y", "4:8", 0.5))
    assert hops(plan_route(v, banned={"solo": 1.0})) == [("solo", "0:8")]


def test_higher_ban_level_avoided_harder() -> None:
    v = view(4, rec("a", "0:4"), rec("b", "0:4", 0.1))
    assert hops(plan_route(v, banned={"a": 3.0, "b": 1.0})) == [("b", "0:4")]


def test_exclude_removes_a_peer_even_if_it_is_the_only_one() -> None:
    v = view(4, rec("a", "0:4", 100.0), rec("b", "0:4", 1.0))
    assert hops(plan_route(v, exclude={"a"})) == [("b", "0:4")]
    with pytest.raises(NoRouteError) as info:
        plan_route(v, exclude=["a", "b"])
    assert info.value.uncovered == [0, 1, 2, 3]


def test_pages_penalty_prefers_peers_with_room() -> None:
    v = view(4, rec("full", "0:4", 100.0, free_pages=2), rec("roomy", "0:4", 1.0, free_pages=50))
    assert hops(plan_route(v)) == [("full", "0:4")]
    assert hops(plan_route(v, pages_needed=2)) == [("full", "0:4")]
    assert hops(plan_route(v, pages_needed=3)) == [("roomy", "0:4")]
    # ...but a full peer still beats a banned one.
    assert hops(plan_route(v, pages_needed=3, banned={"roomy": 1.0})) == [("full", "0:4")]


def test_ties_go_to_fewer_hops() -> None:
    # Every route costs exactly 1.0 s under FREE; the single hop wins.
    v = view(4, rec("b", "0:2", 2.0), rec("c", "2:4", 2.0), rec("z", "0:4", 1.0))
    assert hops(plan_route(v, costs=FREE)) == [("z", "0:4")]


def test_ties_go_to_the_lower_peer_id_whatever_the_record_order() -> None:
    records = [rec(p, "0:4") for p in ("peer-c", "peer-a", "peer-b")]
    for order in (records, records[::-1], records[1:] + records[:1]):
        assert hops(plan_route(view(4, *order))) == [("peer-a", "0:4")]


def test_route_cost_matches_the_planned_minimum() -> None:
    v = view(8, rec("a", "0:6", 6.0), rec("b", "3:8", 5.0), rtt={"a": 0.03})
    route = plan_route(v)
    expected = (0.03 + 0.005 + 6 / 6 / 6.0) + (0.05 + 0.005 + 2 / 5 / 5.0)
    assert route_cost(v, route) == pytest.approx(expected)


def _brute_force_cost(v: SwarmView, costs: RouteCosts) -> float:
    """O(peers * layers^2) relaxation over every (i, j, peer) edge: the reference optimum."""
    n = v.num_layers
    best = [0.0] + [float("inf")] * n
    for j in range(1, n + 1):
        for i in range(j):
            for r in v.online():
                if r.layers.start <= i and j <= r.layers.end:
                    c = hop_cost(r, LayerRange(i, j), v.rtt.get(r.peer_id), costs, 0)
                    best[j] = min(best[j], best[i] + c)
    return best[n]


@st.composite
def small_swarms(draw) -> SwarmView:
    n = draw(st.integers(1, 8))
    records = []
    for index in range(draw(st.integers(1, 7))):
        s = draw(st.integers(0, n - 1))
        e = draw(st.integers(s + 1, n))
        thr = draw(st.sampled_from([0.5, 1.0, 2.0, 3.0, 10.0]))
        records.append(rec(f"p{index}", f"{s}:{e}", thr))
    rtt = {r.peer_id: draw(st.sampled_from([0.0, 0.01, 0.1])) for r in records if draw(st.booleans())}
    return view(n, *records, rtt=rtt)


@settings(max_examples=300, deadline=None)
@given(small_swarms())
def test_plan_route_is_optimal_against_brute_force(v: SwarmView) -> None:
    costs = RouteCosts()
    if v.uncovered_layers():
        with pytest.raises(NoRouteError) as info:
            plan_route(v)
        assert info.value.uncovered == v.uncovered_layers()
        return
    route = plan_route(v)
    assert route[0].layers.start == 0 and route[-1].layers.end == v.num_layers
    for a, b in zip(route, route[1:]):
        assert a.layers.end == b.layers.start
    for h in route:
        assert v.records[h.peer_id].layers.covers(h.layers)
    assert route_cost(v, route, costs=costs) == pytest.approx(_brute_force_cost(v, costs), abs=1e-9)
    assert plan_route(v) == route  # deterministic


def _big_swarm(peers: int, layers: int, seed: int) -> SwarmView:
    rng = random.Random(seed)
    records = {}
    for index in range(peers):
        s = rng.randrange(layers)
        e = min(layers, s + rng.randint(1, 20))
        pid = f"peer{index:05d}"
        records[pid] = PeerRecord(pid, "m", LayerRange(s, e), throughput=rng.uniform(1.0, 50.0))
    return SwarmView("m", layers, records, {p: rng.uniform(0.01, 0.2) for p in records})


def test_plans_a_1000_peer_60_layer_swarm_in_under_50_ms() -> None:
    # Required by the routing issue: clients re-plan on every failure, so this must be cheap.
    v = _big_swarm(1000, 60, seed=1)
    timings = []
    for _ in range(3):
        t0 = time.perf_counter()
        route = plan_route(v)
        timings.append(time.perf_counter() - t0)
    assert route[-1].layers.end == 60
    assert min(timings) < 0.050, f"best of 3 took {min(timings) * 1e3:.1f} ms"
