"""sample_route / choose_route: sessions spread over parallel routes in proportion to spare capacity."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing import NoRouteError, plan_route
from routing.flow import max_flow_of
from routing.spread import choose_route, flow_weights, route_weight, sample_route
from swarm.types import LayerRange, PeerRecord, PeerState
from tests.routing_helpers import hops, rec, view


def busy(peer_id: str, layers: str, throughput: float, free: int, total: int = 100,
         state: PeerState = PeerState.ONLINE) -> PeerRecord:
    return PeerRecord(peer_id, "m", LayerRange.parse(layers), state, throughput, free_pages=free, total_pages=total)


def layer_shares(v, routes: list, num_layers: int) -> list[Counter]:
    out = [Counter() for _ in range(num_layers)]
    for route in routes:
        for hop in route:
            for layer in range(hop.layers.start, hop.layers.end):
                out[layer][hop.peer_id] += 1
    return out


def test_routes_use_each_peer_on_each_layer_as_often_as_its_weight_says() -> None:
    v = view(6, busy("a", "0:6", 10.0, 50), busy("b", "0:3", 10.0, 100), busy("c", "3:6", 30.0, 50),
             busy("d", "2:5", 5.0, 20))
    rng = random.Random(1)
    routes = [sample_route(v, rng) for _ in range(4000)]
    shares = layer_shares(v, routes, 6)
    names = sorted(v.records)
    spans = [v.records[p].layers for p in names]
    weights = dict(zip(names, flow_weights(spans, [route_weight(v.records[p], 0.0, 0) * len(s) for p, s in
                                                   zip(names, spans)], 6)))
    for layer in range(6):
        servers = [p for p in names if layer in v.records[p].layers]
        total = sum(weights[p] for p in servers)
        for p in servers:
            assert shares[layer][p] / 4000 == pytest.approx(weights[p] / total, abs=0.03), (layer, p)


def carried(spans: list[LayerRange], capacities: list[float], weights: list[float], n: int) -> float:
    """The flow a proportional split by `weights` carries before its first peer is full."""
    totals = [sum(w for s, w in zip(spans, weights) if layer in s) for layer in range(n)]
    return min(c / sum(w / totals[layer] for layer in range(s.start, s.end))
               for s, c, w in zip(spans, capacities, weights))


def test_flow_weights_carry_nearly_the_max_flow_on_random_swarms() -> None:
    rng = random.Random(0)
    ratios = []
    for _ in range(200):
        n = rng.randint(2, 30)
        spans, caps = [], []
        for _ in range(rng.randint(1, 15)):
            k = rng.randint(1, n)
            s = rng.randint(0, n - k)
            spans.append(LayerRange(s, s + k))
            caps.append(rng.uniform(1, 10) * k)
        if any(not any(layer in s for s in spans) for layer in range(n)):
            continue
        best = max_flow_of(list(zip(spans, caps)), n)
        even = carried(spans, caps, [c / len(s) for s, c in zip(spans, caps)], n)
        got = carried(spans, caps, flow_weights(spans, caps, n), n)
        assert even - 1e-9 <= got <= best * (1 + 1e-6)
        ratios.append(got / best)
    assert min(ratios) > 0.97 and sum(ratios) / len(ratios) > 0.995


def test_flow_weights_survive_a_long_stretch_of_floored_weights() -> None:
    # A sole server with little capacity over 20,000 layers: its weight falls to WEIGHT_FLOOR, so each
    # of its layers has 1/S ~ 1e12; the next peer's one layer must still count (summing 1/S as a
    # difference of prefix sums rounded it to 0 and divided by zero, seen in the 1,000-peer simulator).
    spans, caps = [LayerRange(0, 20_000), LayerRange(20_000, 20_001)], [1.0, 1e6]
    weights = flow_weights(spans, caps, 20_001)
    assert carried(spans, caps, weights, 20_001) == pytest.approx(max_flow_of(list(zip(spans, caps)), 20_001))


def test_routes_switch_peers_only_where_the_split_changes() -> None:
    # Two identical peers over the whole model: every route is one hop, half on each.
    v = view(8, busy("a", "0:8", 5.0, 10), busy("b", "0:8", 5.0, 10))
    routes = [sample_route(v, random.Random(seed)) for seed in range(200)]
    assert all(len(r) == 1 for r in routes)
    assert 60 < sum(r[0].peer_id == "a" for r in routes) < 140


def test_same_seed_same_route_and_a_chain_has_one_route() -> None:
    v = view(9, busy("a", "0:9", 3.0, 10), busy("b", "0:5", 3.0, 90), busy("c", "4:9", 1.0, 40))
    assert sample_route(v, random.Random(7)) == sample_route(v, random.Random(7))
    chain = view(6, rec("x", "0:2"), rec("y", "2:5"), rec("z", "5:6"))
    assert hops(sample_route(chain, random.Random(0))) == [("x", "0:2"), ("y", "2:5"), ("z", "5:6")]


def test_draining_banned_excluded_and_full_peers_are_avoided_unless_sole() -> None:
    v = view(4, busy("ok", "0:4", 1.0, 100), busy("drain", "0:4", 50.0, 100, state=PeerState.DRAINING),
             busy("banned", "0:4", 50.0, 100), busy("gone", "0:4", 50.0, 100), busy("sole", "3:4", 1.0, 1))
    picked = Counter()
    for seed in range(300):
        route = sample_route(v, random.Random(seed), banned={"banned": 1.0}, exclude={"gone"}, pages_needed=2)
        picked.update(h.peer_id for h in route)
    assert picked["drain"] == picked["banned"] == picked["gone"] == 0
    assert picked["ok"] == 300 and picked["sole"] == 0  # "sole" lacks pages; "ok" also serves layer 3
    alone = view(4, busy("drain", "0:4", 1.0, 100, state=PeerState.DRAINING))
    assert hops(sample_route(alone, random.Random(0))) == [("drain", "0:4")]
    with pytest.raises(NoRouteError):
        sample_route(v, random.Random(0), exclude={"ok", "drain", "banned", "gone"})


def test_choose_route_takes_the_fastest_while_it_has_room_then_spreads() -> None:
    idle = view(4, busy("fast", "0:4", 10.0, 90), busy("slow", "0:4", 4.0, 90))
    assert all(hops(choose_route(idle, random.Random(s))) == [("fast", "0:4")] for s in range(20))
    loaded = view(4, busy("fast", "0:4", 10.0, 30), busy("slow", "0:4", 4.0, 90))
    picked = Counter(choose_route(loaded, random.Random(s))[0].peer_id for s in range(400))
    # weights 10 x 0.3 = 3 and 4 x 0.9 = 3.6: the idle slow peer takes a little more than half
    assert 0.45 < picked["slow"] / 400 < 0.65


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 12).flatmap(lambda n: st.tuples(
        st.just(n),
        st.lists(st.tuples(st.integers(0, n - 1), st.integers(1, n), st.floats(0.1, 50.0), st.integers(0, 10)),
                 min_size=1, max_size=8),
        st.integers(0, 2**32 - 1),
    ))
)
def test_sampled_routes_are_valid_chains(case) -> None:
    n, specs, seed = case
    records = []
    for i, (s, k, thr, free) in enumerate(specs):
        e = min(n, s + k)
        records.append(busy(f"p{i}", f"{s}:{e}", thr, free, total=10))
    v = view(n, *records)
    try:
        plan_route(v)
    except NoRouteError:
        with pytest.raises(NoRouteError):
            sample_route(v, random.Random(seed))
        return
    route = sample_route(v, random.Random(seed))
    assert route[0].layers.start == 0 and route[-1].layers.end == n
    for a, b in zip(route, route[1:]):
        assert a.layers.end == b.layers.start and a.peer_id != b.peer_id
    for hop in route:
        assert v.records[hop.peer_id].layers.covers(hop.layers)


def test_draining_peers_route_only_where_nothing_else_serves_and_survive_the_wire() -> None:
    d = busy("d", "0:4", 100.0, 100, state=PeerState.DRAINING)
    v = view(4, d, rec("slow", "0:2", 1.0), rec("r", "2:4", 1.0))
    assert hops(plan_route(v)) == [("slow", "0:2"), ("r", "2:4")]
    # Sole server of 2:4: the penalty is paid once per hop, so its one hop takes everything.
    assert hops(plan_route(view(4, d, rec("slow", "0:2", 1.0)))) == [("d", "0:4")]
    assert view(4, d).uncovered_layers() == []  # a draining peer still covers its layers
    wire = d.to_dict()
    assert wire["state"] == "online" and wire["draining"] is True  # old readers see it serving
    assert PeerRecord.from_dict(wire) == d
