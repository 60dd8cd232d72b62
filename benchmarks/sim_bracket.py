"""How tightly the optimum of the simulator's swarms is pinned: its bracket per seed, against the capacity bound.

    .venv/bin/python -m benchmarks.sim_bracket --peers 1000 --redundancy 2 --seeds 0-9

For the initial peers of `benchmarks.simulate_swarm` with each seed (the same draws, so the
numbers belong to those runs), prints the capacity bound sum(c) / layers and, as shares of it:
the one-pass placement (`ordered_placement`, the lower end the first sessions used), the
profile placement, and the bracket (`benchmarks.sim_optimum.optimum_bracket`): the better of the two
after a local search of window shifts (`climbed_placement`) below, the capped bound above. A run's
"max flow / bound" divided by the high and the low end gives its share of the optimum.
Writes JSON to benchmarks/results/bracket_<peers>_<redundancy>.json.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.sim_optimum import optimum_bracket
from benchmarks.simulate_swarm import initial_peers


@dataclass(frozen=True)
class SeedBracket:
    seed: int
    layers: int
    bound: float  # sum(c) / layers, tokens/s
    one_pass: float  # the shares below are of `bound`
    profile: float
    low: float  # the optimum is at least this ...
    high: float  # ... and at most this
    seconds: float  # to compute the bracket


def bracket_of(seed: int, peers: int, redundancy: float) -> SeedBracket:
    initial, num_layers = initial_peers(random.Random(seed), peers, redundancy)
    sized = [(p.k, p.k * p.thr) for p in initial]
    bound = sum(c for _, c in sized) / num_layers
    started = time.perf_counter()
    bracket = optimum_bracket(sized, num_layers)
    seconds = time.perf_counter() - started
    return SeedBracket(seed, num_layers, bound, bracket.one_pass / bound, bracket.profile / bound,
                       bracket.low / bound, bracket.high / bound, seconds)


def seed_range(text: str) -> list[int]:
    """'0-9' or '3' or '0,2,5'."""
    out: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        out.extend(range(int(first), int(last or first) + 1))
    return out


def main(argv: list[str] | None = None) -> list[SeedBracket]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", type=int, default=1000, help="initial peers, as simulate_swarm --peers")
    ap.add_argument("--redundancy", type=float, default=2.0, help="copies of the model the peers hold, as simulate_swarm")
    ap.add_argument("--seeds", type=seed_range, default=seed_range("0-9"), help="seeds: '0-9', '3' or '0,2,5'")
    ap.add_argument("--json", type=Path, default=None, help="default: benchmarks/results/bracket_<peers>_<redundancy>.json")
    a = ap.parse_args(argv)
    rows = [bracket_of(seed, a.peers, a.redundancy) for seed in a.seeds]
    print(f"{'seed':>4} {'layers':>6} {'bound':>7} {'one-pass':>8} {'profile':>7} {'optimum in (climbed, capped)':>28} {'s':>5}")
    for r in rows:
        print(f"{r.seed:>4} {r.layers:>6} {r.bound:>7.2f} {r.one_pass:>8.2%} {r.profile:>7.2%} "
              f"{f'[{r.low:.2%}, {r.high:.2%}]':>28} {r.seconds:>5.2f}")
    out = a.json or Path(__file__).parent / "results" / f"bracket_{a.peers}_{a.redundancy:g}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    print(f"wrote {out}")
    return rows


if __name__ == "__main__":
    main()
