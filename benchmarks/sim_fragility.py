"""How deep one crash cuts the max flow: the simulator's placements against the profile placement.

A crash takes one peer's capacity out until a refiller loads its layers. What that costs depends
on the placement: where the crashed peer's layers keep other servers whose windows overlap
theirs at other offsets, the flow shifts along them and the swarm loses about the peer's share;
where one server carries a stretch that its other servers cannot, the max flow falls by half or
more. For each placement this prints, over a sample of peers, the share of peers whose crash
leaves some layer without a GPU server (the flow drops to 0: standbys carry it) and how much of
the max flow the crash of any other peer takes, beside the same numbers for the profile placement
of the same peers (benchmarks/sim_optimum.py, within 0-3% of the optimum).

    .venv/bin/python -m benchmarks.simulate_swarm --peers 1000 ... --snapshots /tmp/placements.jsonl
    .venv/bin/python -m benchmarks.sim_fragility /tmp/placements.jsonl --sample 150

docs/balancing.md (eighteenth session) has the numbers.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.sim_optimum import profile_placement
from routing.flow import max_flow_of
from swarm.types import LayerRange

Placement = list[tuple[LayerRange, float]]


@dataclass(frozen=True)
class Fragility:
    flow_vs_bound: float  # max flow / (sum of capacities / layers)
    peers_sampled: int
    sole_share: float  # share of the sampled peers whose crash leaves a layer without a GPU server
    other_drop_mean: float  # mean share of the max flow lost by the crash of any other sampled peer
    other_drop_p90: float
    other_drop_over_30: float  # share of those crashes that take more than 30% of the max flow


def crash_drops(placement: Placement, num_layers: int, sample: int, rng: random.Random) -> tuple[float, list[float]]:
    """(max flow, share of it lost without each of `sample` random peers: 1.0 where a layer goes dark)."""
    flow = max_flow_of(placement, num_layers)
    chosen = rng.sample(range(len(placement)), min(sample, len(placement)))
    drops = [1.0 - max_flow_of(placement[:i] + placement[i + 1:], num_layers) / flow if flow > 0 else 0.0
             for i in chosen]
    return flow, drops


def fragility(placement: Placement, num_layers: int, sample: int, seed: int = 0) -> Fragility:
    flow, drops = crash_drops(placement, num_layers, sample, random.Random(seed))
    sole = [d for d in drops if d > 0.999]
    other = sorted(max(0.0, d) for d in drops if d <= 0.999)
    bound = sum(c for _, c in placement) / num_layers
    return Fragility(
        flow_vs_bound=flow / bound if bound else 0.0,
        peers_sampled=len(drops),
        sole_share=len(sole) / len(drops) if drops else 0.0,
        other_drop_mean=sum(other) / len(other) if other else 0.0,
        other_drop_p90=other[int(0.9 * len(other))] if other else 0.0,
        other_drop_over_30=sum(1 for d in other if d > 0.3) / len(other) if other else 0.0,
    )


def profile_of(placement: Placement, num_layers: int) -> Placement:
    """The profile placement of the same peers (window sizes and capacities)."""
    peers = [(len(span), capacity) for span, capacity in placement]
    _, spans = profile_placement(peers, num_layers)
    return list(zip(spans, (c for _, c in placement)))


def main(argv: list[str] | None = None) -> list[dict[str, object]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("snapshots", type=Path, help="JSONL written by simulate_swarm --snapshots")
    ap.add_argument("--sample", type=int, default=150, help="peers whose crash is tried per placement")
    ap.add_argument("--json", type=Path, default=None, help="default: next to the snapshots, .fragility.json")
    a = ap.parse_args(argv)
    rows: list[dict[str, object]] = []
    print(f"{'t (h)':>6} | {'placement':>9} | {'flow/bound':>10} | {'dark':>6} | {'other: mean':>11} | {'p90':>6} | {'>30%':>6}")
    for line in a.snapshots.read_text().splitlines():
        snap = json.loads(line)
        num_layers = snap["num_layers"]
        simulated = [(LayerRange(s, e), c) for (s, e), c in zip(snap["spans"], snap["capacities"])]
        for name, placement in (("simulated", simulated), ("profile", profile_of(simulated, num_layers))):
            f = fragility(placement, num_layers, a.sample)
            rows.append({"t_h": snap["t_s"] / 3600, "placement": name, **asdict(f)})
            print(f"{snap['t_s'] / 3600:6.2f} | {name:>9} | {f.flow_vs_bound:10.1%} | {f.sole_share:6.1%} | "
                  f"{f.other_drop_mean:11.1%} | {f.other_drop_p90:6.1%} | {f.other_drop_over_30:6.1%}")
    out = a.json or a.snapshots.with_suffix(".fragility.json")
    out.write_text(json.dumps(rows, indent=1))
    print(f"wrote {out}")
    return rows


if __name__ == "__main__":
    main()
