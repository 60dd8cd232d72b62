"""How long one peer's placement decision and one client's route choice take on a 1,000-peer view.

    .venv/bin/python -m benchmarks.sim_decisions --peers 1000 --seed 0

Builds a SwarmView of `peers` peers drawn from the simulator's GPU classes, placed one after
another where the swarm is weakest, on an 80-layer model and on a model sized for 2x redundancy,
then times (median CPU time of `repeat` calls) what a peer and a client compute from the DHT view:
choose_layers (join), balance_check (a GPU peer's whole periodic check as one call, timed for
`check_peers` peers spread over the view and the peer below: the median and the slowest), should_move
(its first step), strength_move_pays (the gate of a strength move found at a
periodic check: two max flows), flow_move (the same check when should_move says stay or its move does not pay,
timed for a peer that may leave its layers and does not hold the bottleneck: the whole computation, every window
holding the first short layer tried), urgent_layers (the watch every 5 s: gaps
and thin layers), exposes_on_leaving (the same watch once it wakes: does this peer react a step later),
standby_layers (a standby's check, with every peer on its own machine), choose_route on an idle and a busy swarm, and the exact max
flow (routing.flow; only the simulator and benchmarks need it).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from pathlib import Path

from benchmarks.simulate_swarm import GPU_CLASSES, THROUGHPUT_SIGMA
from routing import (
    balance_check,
    choose_layers,
    choose_route,
    choose_window,
    exposes_on_leaving,
    flow_move,
    layer_servers,
    max_flow_throughput,
    should_move,
    standby_layers,
    strength_move_pays,
    urgent_layers,
    view_flow,
)
from routing.flow import bottleneck_layer
from routing.flow_move import mover_in
from routing.layer_view import balanced_placement, staying_throughput
from routing.leaving import leaves_safely, thin_threshold
from swarm.types import LayerRange, PeerRecord, PeerState, SwarmView


def build_view(peers: int, num_layers: int | None, seed: int, busy: bool) -> SwarmView:
    rng = random.Random(seed)
    drawn = []
    for _ in range(peers):
        k, median, _ = rng.choices(GPU_CLASSES, [c[2] for c in GPU_CLASSES])[0]
        drawn.append((k, median * math.exp(rng.gauss(0, THROUGHPUT_SIGMA))))
    n = num_layers or round(sum(k for k, _ in drawn) / 2)
    thr, counts = [0.0] * n, [0] * n  # placed with the array form of choose_layers, one peer at a time
    records: dict[str, PeerRecord] = {}
    for i, (k, t) in enumerate(drawn):
        layers = choose_window(thr, min(k, n), counts)
        for layer in range(layers.start, layers.end):
            thr[layer] += t
            counts[layer] += 1
        free = rng.randint(0, 400) if busy else 1000
        pid = f"peer{i:05d}"
        records[pid] = PeerRecord(pid, "m", layers, PeerState.ONLINE, t, free_pages=free, total_pages=1000)
    return SwarmView("m", n, records, {p: rng.uniform(0.01, 0.15) for p in records})


def full_flow_check_peer(view: SwarmView) -> str:
    """A peer whose flow_move runs every step: it may leave its layers and does not hold the bottleneck."""
    bottleneck = bottleneck_layer(balanced_placement(view), view.num_layers)
    limit = thin_threshold(view)
    for peer_id in sorted(view.records):
        layers = view.records[peer_id].layers
        if (bottleneck is not None and not layers.start <= bottleneck < layers.end
                and leaves_safely(layers, layer_servers(view, without=peer_id),
                                  staying_throughput(view, without=peer_id), limit)):
            return peer_id
    raise ValueError("no peer may leave its layers in this view")


def median_ms(fn, repeat: int) -> float:
    """Median CPU time of this process per call: on a shared machine wall time measures the neighbours."""
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        times.append((time.process_time() - t0) * 1e3)
    return statistics.median(times)


def full_strength_gate(view: SwarmView, me: str) -> bool:
    """routing.move_gate's whole computation for `me` (what strength_move_pays_in does, without the early
    yes of a target holding a layer with one server): both max flows, the move's and the view's."""
    current, capacity = mover_in(view, me)
    start = (current.start + view.num_layers // 2) % (view.num_layers - len(current))  # far from its own layers
    target = LayerRange(start, start + len(current))
    flow_now, _ = view_flow(view, me)
    return strength_move_pays(balanced_placement(view, without=me), view.num_layers, current, target, capacity,
                              [2] * view.num_layers, flow_now)


def whole_check_ms(view: SwarmView, check_peers: int, repeat: int) -> tuple[float, float]:
    """(median, slowest) over `check_peers` peers evenly spread over the view's ids, and the peer whose
    flow_move runs every step (full_flow_check_peer), of each peer's median time for one periodic
    balance_check that may make a flow move: the whole decision, as peer/balancer.py calls it."""
    ids = sorted(view.records)
    peers = {ids[i * len(ids) // check_peers] for i in range(check_peers)} | {full_flow_check_peer(view)}
    times = [median_ms(lambda me=me: balance_check(view, me, since_last_move_s=None, periodic=True), repeat)
             for me in sorted(peers)]
    return statistics.median(times), max(times)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--check-peers", type=int, default=40, help="peers whose whole balance check is timed")
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "decisions.json")
    a = ap.parse_args(argv)
    rows = {}
    for label, layers in (("80 layers", 80), ("2x (layers = sum k / 2)", None)):
        view = build_view(a.peers, layers, a.seed, busy=False)
        busy = build_view(a.peers, layers, a.seed, busy=True)
        me = sorted(view.records)[a.peers // 2]
        rng = random.Random(a.seed)
        machines = {p: f"10.0.{i // 250}.{i % 250}" for i, p in enumerate(sorted(view.records))}
        check_median, check_max = whole_check_ms(view, a.check_peers, a.repeat)
        rows[label] = {
            "layers": view.num_layers,
            "choose_layers_ms": median_ms(lambda v=view: choose_layers(v, 8), a.repeat),
            "balance_check_median_ms": check_median,
            "balance_check_max_ms": check_max,
            "should_move_ms": median_ms(lambda v=view, me=me: should_move(v, me), a.repeat),
            "strength_gate_ms": median_ms(lambda v=view, me=me: full_strength_gate(v, me), a.repeat),
            "flow_move_ms": median_ms(lambda v=view, me=full_flow_check_peer(view): flow_move(v, me, since_last_move_s=None),
                                      a.repeat),
            "urgent_layers_ms": median_ms(lambda v=view: urgent_layers(v), a.repeat),
            "exposes_on_leaving_ms": median_ms(lambda v=view, me=me: exposes_on_leaving(v, me), a.repeat),
            "standby_layers_ms": median_ms(lambda v=view, m=machines: standby_layers(v, "standby", 8, m), a.repeat),
            "choose_route_idle_ms": median_ms(lambda v=view, rng=rng: choose_route(v, rng), a.repeat),
            "choose_route_busy_ms": median_ms(lambda v=busy, rng=rng: choose_route(v, rng), a.repeat),
            "max_flow_ms": median_ms(lambda v=view: max_flow_throughput(v), 1),
        }
    header = ["view", "layers", "choose_layers", "balance check (median)", "balance check (slowest)", "should_move", "strength gate", "flow_move", "urgent_layers", "exposes_on_leaving", "standby_layers", "choose_route idle", "choose_route busy", "max flow"]
    print(" | ".join(header))
    for label, r in rows.items():
        print(" | ".join([label, str(r["layers"])] + [f"{r[k]:.1f} ms" for k in list(r)[1:]]))
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps({"peers": a.peers, "seed": a.seed, "rows": rows}, indent=1))
    print(f"wrote {a.json}")
    return rows


if __name__ == "__main__":
    main()
