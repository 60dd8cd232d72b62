"""The swarm simulator runs the routing functions end to end and reports sane numbers."""

from __future__ import annotations

import json

from benchmarks.simulate_swarm import SimConfig, format_table, main, simulate


def test_small_swarm_for_one_hour_stays_covered() -> None:
    # 50 peers on a 60-layer model (about 9x redundancy): churn never opens a gap.
    r = simulate(SimConfig(peers=50, hours=1.0, seed=3, layers=60))
    assert r.num_layers == 60
    assert r.coverage_time_fraction == 1.0
    assert r.uncovered_layer_time_fraction == 0.0
    assert 0.3 < r.bottleneck_vs_bound_mean <= 1.0
    assert 0.0 <= r.migrations_per_peer_hour < 1.0
    assert r.routes_failed == 0 and r.route_hops_mean is not None and r.route_hops_mean >= 1
    assert r.route_cost_s_mean is not None and r.route_cost_s_mean > 0
    assert len(r.series["t_h"]) == 61 and r.series["uncovered_layers"][-1] == 0
    assert "coverage" in format_table(r)


def test_simulation_is_deterministic_per_seed() -> None:
    a = simulate(SimConfig(peers=40, hours=0.5, seed=1, layers=30))
    b = simulate(SimConfig(peers=40, hours=0.5, seed=1, layers=30))
    assert (a.series, a.migrations, a.joins) == (b.series, b.migrations, b.joins)


def test_cli_writes_json(tmp_path) -> None:
    out = tmp_path / "r.json"
    main(["--peers", "30", "--hours", "0.25", "--layers", "24", "--json", str(out)])
    data = json.loads(out.read_text())
    assert data["num_layers"] == 24 and 0.0 <= data["coverage_time_fraction"] <= 1.0
