"""Routing on throughput the client measured: an announced 1e6 tokens/s buys no traffic (eclipse)."""

from __future__ import annotations

import random

from client.measured import MeasuredThroughput
from routing import choose_route
from tests.routing_helpers import hops, rec, view


def test_a_peer_that_announces_more_than_it_delivers_loses_its_routes() -> None:
    swarm = view(8, rec("liar", "0:8", 1e6), rec("honest", "0:8", 50.0))
    measured = MeasuredThroughput()
    assert hops(choose_route(measured.apply(swarm), random.Random(0))) == [("liar", "0:8")]
    for _ in range(5):  # 20 decode steps/s through its 8 layers: 20 tokens/s, far below 1e6
        measured.observe("liar", layers=8, tokens=1, seconds=0.05)
    assert measured.apply(swarm).records["liar"].throughput == 20.0
    assert hops(choose_route(measured.apply(swarm), random.Random(0))) == [("honest", "0:8")]


def test_measurements_average_and_never_raise_the_announced_figure() -> None:
    swarm = view(4, rec("a", "0:4", 10.0), rec("b", "0:2", 100.0))
    measured = MeasuredThroughput()
    measured.observe("a", layers=2, tokens=4, seconds=0.1)  # a sub-range hop: 80 layer-tokens/s
    assert measured.apply(swarm).records["a"].throughput == 10.0  # measured 20/s over 4 layers > announced 10
    measured.observe("b", layers=2, tokens=1, seconds=1.0)  # 2 layer-tokens/s -> 1 token/s over its 2 layers
    measured.observe("b", layers=2, tokens=1, seconds=0.5)  # 4 -> moving average 2 + 0.3 * (4 - 2) = 2.6
    assert abs(measured.layer_tokens_per_second("b") - 2.6) < 1e-9
    assert abs(measured.apply(swarm).records["b"].throughput - 1.3) < 1e-9
    measured.observe("b", layers=2, tokens=1, seconds=0.0)  # timer artefacts are ignored
    measured.observe("gone", layers=2, tokens=1, seconds=1.0)  # a peer no longer in the view changes nothing
    assert set(measured.apply(swarm).records) == {"a", "b"}
    assert swarm.records["b"].throughput == 100.0  # the view itself is untouched
