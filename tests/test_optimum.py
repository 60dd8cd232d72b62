"""The optimum to measure against: exact max flow of a placement, and of the best placement."""

from __future__ import annotations

import itertools
import random

import pytest

from benchmarks.sim_optimum import (
    best_placement,
    capped_capacity_bound,
    optimum_bracket,
    ordered_placement,
    profile_placement,
)
from routing.flow import (
    Greedy,
    bottleneck_layer,
    capacity_bound,
    feasible,
    feed_greedily,
    max_flow_of,
    max_flow_throughput,
)
from swarm.types import LayerRange, PeerState
from tests.routing_helpers import rec, view


def lp_max_flow(placement: list[tuple[LayerRange, float]], num_layers: int) -> float:
    """The same quantity by a general LP solver (HiGHS), as an independent reference."""
    import numpy as np
    from scipy.optimize import linprog

    n = len(placement)
    nvar = n * num_layers + 1  # x[p][l], then F
    a_ub, b_ub = [], []
    for p, (_, cap) in enumerate(placement):
        row = np.zeros(nvar)
        row[p * num_layers : (p + 1) * num_layers] = 1
        a_ub.append(row)
        b_ub.append(cap)
    for layer in range(num_layers):
        row = np.zeros(nvar)
        for p in range(n):
            row[p * num_layers + layer] = -1
        row[-1] = 1
        a_ub.append(row)
        b_ub.append(0.0)
    bounds = [
        (0, None if layers.start <= layer < layers.end else 0)
        for layers, _ in placement
        for layer in range(num_layers)
    ] + [(0, None)]
    c = np.zeros(nvar)
    c[-1] = -1
    res = linprog(c, A_ub=np.array(a_ub), b_ub=b_ub, bounds=bounds, method="highs")
    assert res.status == 0
    return -res.fun


def random_placement(rng: random.Random, num_layers: int, peers: int) -> list[tuple[LayerRange, float]]:
    out = []
    for _ in range(peers):
        k = rng.randint(1, num_layers)
        s = rng.randint(0, num_layers - k)
        out.append((LayerRange(s, s + k), rng.choice([0.5, 1.0, 2.0, 3.0, 7.0]) * k))
    return out


def test_max_flow_matches_a_general_lp_solver_on_random_placements() -> None:
    rng = random.Random(0)
    for _ in range(150):
        num_layers = rng.randint(1, 7)
        placement = random_placement(rng, num_layers, rng.randint(1, 5))
        expected = lp_max_flow(placement, num_layers)
        assert max_flow_of(placement, num_layers) == pytest.approx(expected, rel=1e-7, abs=1e-9)


@pytest.mark.parametrize("tolerance", [1e-9, 5e-5, 1e-3])
def test_the_secant_search_is_feasible_and_within_its_tolerance_of_a_plain_bisection(tolerance: float) -> None:
    """max_flow_of steps down from above along the greedy's shortfall; a plain bisection on feasible()
    (the search before) run to float precision is the reference: the answer is feasible and at most `tolerance` under it,
    on small random swarms and on 500-layer ones of 200 consecutive windows (where the search starts just
    above the even spread's flow and takes its secant steps)."""
    rng = random.Random(1)
    cases = [(n, random_placement(rng, n, rng.randint(1, 30))) for n in (rng.randint(1, 40) for _ in range(300))]
    for _ in range(5):  # 200 peers on 500 layers: windows of 4-24 laid end to end, wrapping
        spans = [rng.choice((4, 8, 12, 16, 24)) for _ in range(200)]
        starts = itertools.accumulate([0, *spans[:-1]])
        cases.append((500, [(LayerRange(st % 477, st % 477 + k), k * rng.uniform(0.5, 3.0))
                            for st, k in zip(starts, spans)]))
    for num_layers, placement in cases:
        lo, hi = 0.0, sum(c for _, c in placement) + 1.0
        for _ in range(60):  # to ~1e-16 of the start: below 1e-13 of any flow but a zero one
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if feasible(placement, num_layers, mid) else (lo, mid)
        found = max_flow_of(placement, num_layers, tolerance)
        assert feasible(placement, num_layers, found)
        assert lo * (1 - tolerance) <= found <= hi, (num_layers, placement)


def test_a_greedy_grown_by_one_peer_is_the_greedy_of_the_longer_placement() -> None:
    """Greedy.with_peer (a flow move tries one peer in many windows on others prepared once) gives the same
    runs as preparing the placement with that peer appended, and so the same feeds, bit for bit: windows at
    and off the others' bounds, at the model's ends, past it, and at no capacity."""
    rng = random.Random(2)
    for _ in range(300):
        num_layers = rng.randint(1, 40)
        others = random_placement(rng, num_layers, rng.randint(0, 12))
        others += [(LayerRange(rng.randint(0, num_layers - 1), num_layers + rng.randint(1, 3)), 0.0)] * rng.randint(0, 1)
        k = rng.randint(1, num_layers + 2)
        start = rng.randint(0, num_layers + 1)
        extra = (LayerRange(start, start + k), rng.choice([0.0, 1.0, 2.5]) * k)
        prepared = Greedy(others, num_layers)
        grown, whole = prepared.with_peer(*extra), Greedy([*others, extra], num_layers)
        assert (grown.edges, grown.runs, grown.peers) == (whole.edges, whole.runs, whole.peers)
        flow = rng.uniform(0.1, 5.0)
        assert grown.feed(flow, False, True) == whole.feed(flow, False, True)
        if all(layers.end <= num_layers for layers, _ in [*others, extra]):  # max_flow_of takes placements in the model
            assert max_flow_of([*others, extra], num_layers, greedy=grown) == max_flow_of([*others, extra], num_layers)
        # the prepared greedy itself is left as it was
        assert prepared.feed(flow, False, True) == feed_greedily(others, num_layers, flow)


def test_the_search_brackets_are_the_per_layer_sums_bit_for_bit() -> None:
    """max_flow_of starts from the min over layers of the even spread and of the servers' whole capacities,
    summed per run of layers with the same servers: the same floats as summing every peer into every layer
    in placement order (so the search, and every simulated run, takes the same steps as before)."""
    from routing.flow import _even_spread_and_all_on_one

    rng = random.Random(3)
    for _ in range(500):
        num_layers = rng.randint(1, 60)
        placement = random_placement(rng, num_layers, rng.randint(0, 25))
        placement += [(layers, rng.choice([0.0, 1 / 3, 0.1]) * len(layers)) for layers, _ in placement[:3]]
        even, whole = [0.0] * num_layers, [0.0] * num_layers
        for layers, capacity in placement:
            for layer in range(layers.start, layers.end):
                even[layer] += capacity / len(layers)
                whole[layer] += capacity
        assert _even_spread_and_all_on_one(placement, num_layers) == (min(even), min(whole))
    with pytest.raises(ValueError, match="must lie in the model"):
        _even_spread_and_all_on_one([(LayerRange(2, 6), 1.0)], 5)


def test_capacity_shared_across_non_adjacent_layers_is_counted_once() -> None:
    # One peer of capacity 2 holds 0:3 and alone serves layers 0 and 2; layer 1 has plenty.
    # Checking each run of layers alone would allow 2 tokens/s; layers {0, 2} together share
    # the peer, so the max flow is 1.
    placement = [(LayerRange(0, 3), 2.0), (LayerRange(1, 2), 100.0)]
    assert max_flow_of(placement, 3) == pytest.approx(1.0)
    assert feasible(placement, 3, 0.999) and not feasible(placement, 3, 1.001)


def test_flow_lies_between_the_spread_bottleneck_and_the_capacity_bound() -> None:
    # thr 1 over 0:4 (capacity 4), thr 1 over 2:4 (capacity 2): layers 2-3 have spread throughput 2,
    # layers 0-1 only 1; the first peer can shift capacity to 0-1 while the second covers 2-3.
    v = view(4, rec("a", "0:4", 1.0), rec("b", "2:4", 1.0), rec("j", "0:4", 9.0, state=PeerState.JOINING))
    flow = max_flow_throughput(v)
    assert flow == pytest.approx(1.5)  # a gives 1.5 to layers 0,1 (3), 0.5 to 2,3 (1); b gives 1 each
    assert capacity_bound(v) == pytest.approx(1.5)
    assert max_flow_throughput(v, states=(PeerState.ONLINE, PeerState.JOINING)) > flow


def test_an_uncovered_layer_means_zero_flow() -> None:
    assert max_flow_throughput(view(5, rec("a", "0:2", 3.0), rec("b", "3:5", 3.0))) == 0.0
    assert max_flow_of([], 3) == 0.0


def brute_force_best(peers: list[tuple[int, float]], num_layers: int) -> float:
    choices = [[LayerRange(s, s + k) for s in range(num_layers - k + 1)] for k, _ in peers]
    return max(
        max_flow_of(list(zip(windows, (c for _, c in peers))), num_layers)
        for windows in itertools.product(*choices)
    )


@pytest.mark.parametrize("seed", range(6))
def test_best_placement_equals_brute_force_on_small_swarms(seed: int) -> None:
    rng = random.Random(seed)
    num_layers = rng.randint(3, 6)
    peers = [(rng.randint(1, num_layers), rng.choice([1.0, 2.0, 5.0])) for _ in range(rng.randint(2, 4))]
    peers = [(k, k * t) for k, t in peers]
    opt = best_placement(peers, num_layers, time_limit_s=10)
    expected = brute_force_best(peers, num_layers)
    assert opt.optimal
    assert opt.best == pytest.approx(expected, rel=1e-6, abs=1e-9)
    assert opt.bound >= opt.best - 1e-9
    assert max_flow_of(list(zip(opt.placement, (c for _, c in peers))), num_layers) == pytest.approx(opt.best)
    # The one-pass placement (the lower bound used where a MILP is too big) is a real placement.
    flow, placement = ordered_placement(peers, num_layers)
    assert [len(r) for r in placement] == [min(k, num_layers) for k, _ in peers]
    assert flow == pytest.approx(max_flow_of(list(zip(placement, (c for _, c in peers))), num_layers))
    assert flow <= expected * (1 + 1e-6)


def test_bottleneck_layer_is_where_the_greedy_runs_dry() -> None:
    # 0:2 has 10 + 10 per layer to spare, 2:4 one peer of capacity 4: the flow is 2, short at 3.
    placement = [(LayerRange(0, 2), 20.0), (LayerRange(0, 2), 20.0), (LayerRange(2, 4), 4.0)]
    assert max_flow_of(placement, 4) == pytest.approx(2.0)
    assert bottleneck_layer(placement, 4) == 3
    assert bottleneck_layer([(LayerRange(0, 2), 4.0)], 4) is None  # uncovered layers: no flow


@pytest.mark.parametrize("seed", range(12))
def test_the_bracket_holds_the_brute_force_optimum(seed: int) -> None:
    rng = random.Random(100 + seed)
    num_layers = rng.randint(2, 6)
    peers = [(rng.randint(1, num_layers), rng.choice([1.0, 2.0, 5.0, 20.0])) for _ in range(rng.randint(1, 4))]
    peers = [(k, k * t) for k, t in peers]
    optimum = brute_force_best(peers, num_layers)
    bracket = optimum_bracket(peers, num_layers)
    assert bracket.low <= optimum * (1 + 1e-6) and optimum <= bracket.high * (1 + 1e-9)
    assert bracket.high <= sum(c for _, c in peers) / num_layers * (1 + 1e-12)  # never looser than the plain bound
    flow, placement = profile_placement(peers, num_layers)  # a real placement, its flow exact
    assert [len(r) for r in placement] == [min(k, num_layers) for k, _ in peers]
    assert all(0 <= r.start and r.end <= num_layers for r in placement)
    assert flow == pytest.approx(max_flow_of(list(zip(placement, (c for _, c in peers))), num_layers))
    assert bracket.low == pytest.approx(max_flow_of(list(zip(bracket.placement, (c for _, c in peers))), num_layers))
    assert [len(r) for r in bracket.placement] == [min(k, num_layers) for k, _ in peers]  # the climb shifts, never resizes
    assert all(0 <= r.start and r.end <= num_layers for r in bracket.placement)


def test_a_fast_peer_cannot_spend_more_than_the_flow_on_its_one_layer() -> None:
    # Two one-layer peers on a two-layer model: 10 and 2 tokens/s. The plain bound says 6; the
    # best placement (one on each layer) carries 2, and so does the capped bound: 2 * 2 <= min(10, 2) + 2.
    peers = [(1, 10.0), (1, 2.0)]
    assert capped_capacity_bound(peers, 2) == pytest.approx(2.0)
    assert brute_force_best(peers, 2) == pytest.approx(2.0)
    assert optimum_bracket(peers, 2).low == pytest.approx(2.0)
    assert capped_capacity_bound([(1, 10.0)], 2) == 0.0  # one layer held, two needed: nothing is served


def test_the_bracket_pins_a_simulated_public_swarm_within_two_percent() -> None:
    from benchmarks.sim_bracket import bracket_of

    r = bracket_of(seed=0, peers=200, redundancy=2.0)  # 1,092 layers: far beyond the MILP
    assert r.high - r.low < 0.02, r
    assert r.low > r.one_pass  # the profile placement beats the one-pass placement the first sessions used


def test_window_shifts_pin_a_500_peer_swarm_within_a_fifth_of_a_point() -> None:
    """The profile placement's rounded window ends waste 1-2 points of sum(c) / L at 500-1,000 peers;
    climbed_placement's shifts win most of it back, so the bracket narrows from ~1.3 points to < 0.2."""
    from benchmarks.sim_bracket import bracket_of

    r = bracket_of(seed=0, peers=500, redundancy=2.0)  # 2,670 layers
    assert r.high - r.profile > 0.01, r  # what the climb starts from is a point or more under the capped bound
    assert r.high - r.low < 0.002, r
