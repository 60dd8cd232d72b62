"""Helix-like clusters: LLaMA-70B on 24 or 42 mixed GPUs, placement and routing against the optimum.

    .venv/bin/python -m benchmarks.sim_cluster --cluster helix24 --seed 0

Peers join one by one in a seeded random order and pick layers with routing.choose_window
(tiered and staggered as the peers are: routing.layer_view.crossing_throughput); then every
peer runs its balance check in random order until a whole round moves nobody (the decentralised
balance loop, without its waiting): routing.plan_move's strength move when it pays
(routing.strength_move_pays_in, as at the peer's periodic checks), else routing.flow_move. Clients then open `sessions`
long-running sessions one after another, each routed by routing.choose_route on a view whose
announced spare fraction is refreshed every ANNOUNCE_EVERY sessions (announcements lag).
Every session decodes as fast as its route allows; peers share their compute max-min
fairly between the sessions they serve (progressive filling), which gives the swarm's
served tokens/s. That is compared with the max flow of the placement (routing.flow) and
with the best placement's max flow (benchmarks.sim_optimum, MILP; or the capacity bound
when the placement already reaches it).

GPU figures: memory and dense fp16 TFLOPS from the vendors' sheets. A peer holds
floor(memory x (1 - KV_RESERVE) / LAYER_GB) layers; its capacity in layer-tokens/s is
TFLOPS x MFU / (2 x params per layer): batched decode is compute-bound.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from routing import (
    DEFAULT_QUALITY,
    choose_route,
    choose_window,
    flow_move,
    layer_servers,
    layer_throughput,
    plan_move,
    plan_route,
    route_cost,
    strength_move_pays_in,
    view_flow,
)
from routing.flow import max_flow_of
from routing.layer_view import crossing_throughput
from swarm.types import LayerRange, PeerRecord, PeerState, SwarmView

LLAMA70B_LAYERS = 80
LAYER_PARAMS = 0.856e9  # q,o 8192^2 each; k,v 8192x1024 each (GQA); MLP 3 x 8192 x 28672
LAYER_GB = LAYER_PARAMS * 2 / 1e9  # fp16 weights: 1.71 GB per layer
KV_RESERVE = 0.15  # memory kept for KV pages and activations
MFU = 0.4  # share of peak fp16 FLOPS a batched decode reaches

# name: (memory GB, dense fp16 TFLOPS)
GPUS = {"A100-80G": (80, 312.0), "A100-40G": (40, 312.0), "L4": (24, 121.0), "T4": (16, 65.0), "A10": (24, 125.0),
        "V100-32G": (32, 125.0)}
# Helix (ASPLOS'25) single-cluster setup: 4 A100 + 8 L4 + 12 T4. The 42-GPU one here adds a second
# region of mixed cards (our choice, in Helix' spirit): RTTs 1-3 ms inside a region, 30-60 ms across.
CLUSTERS = {
    "helix24": [("A100-80G", 4, 0), ("L4", 8, 0), ("T4", 12, 0)],
    "helix42": [("A100-80G", 4, 0), ("L4", 8, 0), ("T4", 12, 0), ("A100-40G", 4, 1), ("A10", 6, 1), ("V100-32G", 8, 1)],
}
REGION_RTT_S = {0: (0.001, 0.003), 1: (0.030, 0.060)}  # the clients sit in region 0
ANNOUNCE_EVERY = 20  # sessions opened between two refreshes of the announced load


@dataclass
class ClusterResult:
    cluster: str
    seed: int
    peers: int
    layer_slots: int  # sum of layers the peers can hold (redundancy = this / 80)
    joins_moves: int  # moves made by the balance rounds after the joins
    bottleneck: float  # min per-layer sum of throughput (everyone spreading evenly)
    placement_flow: float  # max flow of the final placement (layer-tokens/s / layer = tokens/s)
    optimum: float  # best placement's max flow found (== bound when proven)
    optimum_bound: float
    served_spread: float  # max-min fair tokens/s with sessions routed by choose_route
    served_fastest: float  # same with every session on plan_route's fastest route
    route_hops_spread: float
    route_hops_fastest: float
    route_latency_spread_s: float  # plan cost of the routes (RTT + compute per token), mean
    route_latency_fastest_s: float
    load_spread: float  # max / mean utilisation of peers under choose_route
    wall_s: float


def cluster_peers(name: str, rng: random.Random) -> list[tuple[str, int, float, float]]:
    """(peer id, layers held, layer-tokens/s, rtt) per GPU of the cluster, in a seeded random order."""
    out = []
    for gpu, count, region in CLUSTERS[name]:
        memory, tflops = GPUS[gpu]
        k = min(LLAMA70B_LAYERS, math.floor(memory * (1 - KV_RESERVE) / LAYER_GB))
        rate = tflops * 1e12 * MFU / (2 * LAYER_PARAMS)
        for i in range(count):
            out.append((f"{gpu}-{i}", k, rate, rng.uniform(*REGION_RTT_S[region])))
    rng.shuffle(out)
    return out


def place(peers: list[tuple[str, int, float, float]], num_layers: int, quality: float) -> tuple[list[LayerRange], int]:
    """Join in order with choose_window, then balance rounds until nobody moves (at most 50); tiered
    as routing.balance is (a peer weighs the peers holding at least as many layers)."""
    ranges: list[LayerRange] = []
    for _, k, _, _ in peers:
        placed = _placed(peers, ranges, num_layers)
        ranges.append(choose_window(layer_throughput(placed, min_layers=k), k,
                                    crossing=crossing_throughput(placed, min_layers=k)))
    moves = 0
    order = list(range(len(peers)))
    rng = random.Random(len(peers))
    for _ in range(50):
        rng.shuffle(order)
        moved = False
        for i in order:
            name, k, rate, _ = peers[i]
            view = _placed(peers, ranges, num_layers)
            others = layer_throughput(view, without=name, min_layers=k)
            target = plan_move(others, layer_servers(view, without=name), ranges[i], rate / k, quality,
                               crossing=crossing_throughput(view, without=name, min_layers=k))
            flow = None  # one max flow for the gate and flow_move, as at the peer
            if target is not None:
                flow = view_flow(view, name)
                if not strength_move_pays_in(view, name, target, flow_now=flow[0]):
                    target = None
            if target is None:  # no cooldown: the loop ends when a whole round moves nobody
                target = flow_move(view, name, since_last_move_s=None, flow=flow)
            if target is not None:
                ranges[i] = target
                moves += 1
                moved = True
        if not moved:
            break
    return ranges, moves


def _placed(peers, ranges: list[LayerRange], num_layers: int) -> SwarmView:
    """The peers placed so far (the first len(ranges)), ONLINE, announcing rate / k tokens/s."""
    records = {pid: PeerRecord(pid, "llama-70b", r, PeerState.ONLINE, rate / k) for (pid, k, rate, _), r in zip(peers, ranges)}
    return SwarmView("llama-70b", num_layers, records)


def serve(peers, ranges, num_layers: int, sessions: int, spread: bool, seed: int) -> tuple[float, list, list[float]]:
    """Open `sessions` sessions one by one; return (max-min fair tokens/s, routes, utilisation per peer)."""
    caps = [rate for _, _, rate, _ in peers]
    # Announced load: layer-sessions on the peer over what it can carry at the nominal rate
    # (the rate at which `sessions` sessions would fill the swarm's whole capacity).
    nominal = sum(caps) / num_layers / sessions
    used = [0.0] * len(peers)
    index = {p[0]: i for i, p in enumerate(peers)}
    rng = random.Random(seed)
    routes = []
    view = None
    for s in range(sessions):
        if s % ANNOUNCE_EVERY == 0:
            view = _view(peers, ranges, num_layers, used, caps, nominal)
        route = choose_route(view, rng) if spread else plan_route(view)
        routes.append(route)
        for hop in route:
            used[index[hop.peer_id]] += len(hop.layers) * nominal
    rates = _max_min_fair(routes, index, caps)
    load = [0.0] * len(peers)
    for route, r in zip(routes, rates):
        for hop in route:
            load[index[hop.peer_id]] += len(hop.layers) * r
    return sum(rates), routes, [u / c for u, c in zip(load, caps)]


def _view(peers, ranges, num_layers, used, caps, nominal) -> SwarmView:
    records = {}
    for (pid, k, rate, _), r, u, c in zip(peers, ranges, used, caps):
        free = max(0, round(1000 * (1 - u / c)))
        records[pid] = PeerRecord(pid, "llama-70b", r, PeerState.ONLINE, rate / k, free_pages=free, total_pages=1000)
    return SwarmView("llama-70b", num_layers, records, {p[0]: p[3] for p in peers})


def _max_min_fair(routes, index, caps) -> list[float]:
    """Progressive filling: all unfrozen sessions speed up together until some peer is full."""
    demand = [[(index[h.peer_id], len(h.layers)) for h in route] for route in routes]
    rates = [0.0] * len(routes)
    left = caps[:]
    active = set(range(len(routes)))
    while active:
        per_peer = [0.0] * len(caps)
        for s in active:
            for p, layers in demand[s]:
                per_peer[p] += layers
        step = min(left[p] / w for p, w in enumerate(per_peer) if w > 0)
        for s in active:
            rates[s] += step
        for p, w in enumerate(per_peer):
            left[p] -= step * w
        full = {p for p, w in enumerate(per_peer) if w > 0 and left[p] <= 1e-9 * caps[p]}
        active = {s for s in active if not any(p in full for p, _ in demand[s])}
    return rates


def run(cluster: str, seed: int, sessions: int, quality: float, time_limit_s: float) -> ClusterResult:
    from benchmarks.sim_optimum import best_placement

    wall0 = time.perf_counter()
    rng = random.Random(seed)
    peers = cluster_peers(cluster, rng)
    n = LLAMA70B_LAYERS
    ranges, moves = place(peers, n, quality)
    caps = [rate for _, _, rate, _ in peers]
    thr = [0.0] * n
    for (_, k, rate, _), r in zip(peers, ranges):
        for layer in range(r.start, r.end):
            thr[layer] += rate / k
    flow = max_flow_of(list(zip(ranges, caps)), n)
    bound = sum(caps) / n
    if flow >= bound * (1 - 1e-9):
        best, proven = flow, bound  # the placement reaches the capacity bound: it is optimal
    else:
        opt = best_placement([(k, c) for (_, k, _, _), c in zip(peers, caps)], n, time_limit_s)
        best, proven = max(opt.best, flow), opt.bound
    spread, routes_s, util = serve(peers, ranges, n, sessions, True, seed)
    fastest, routes_f, _ = serve(peers, ranges, n, sessions, False, seed)
    view = _view(peers, ranges, n, [0.0] * len(peers), caps, 1.0)
    mean_util = sum(util) / len(util)
    return ClusterResult(
        cluster, seed, len(peers), sum(k for _, k, _, _ in peers), moves, min(thr), flow, best, proven,
        spread, fastest,
        sum(len(r) for r in routes_s) / len(routes_s), sum(len(r) for r in routes_f) / len(routes_f),
        sum(route_cost(view, r) for r in routes_s) / len(routes_s),
        sum(route_cost(view, r) for r in routes_f) / len(routes_f),
        max(util) / mean_util if mean_util else 0.0,
        time.perf_counter() - wall0,
    )


def format_table(r: ClusterResult) -> str:
    rows = [
        ("cluster / peers / layer slots", f"{r.cluster} / {r.peers} / {r.layer_slots} ({r.layer_slots / 80:.1f}x of 80)"),
        ("moves after joining", f"{r.joins_moves}"),
        ("optimum (best placement) / bound", f"{r.optimum:.1f} / {r.optimum_bound:.1f} tokens/s"),
        ("placement max flow / optimum", f"{r.placement_flow:.1f} tokens/s = {r.placement_flow / r.optimum:.1%}"),
        ("bottleneck (even spread) / optimum", f"{r.bottleneck:.1f} = {r.bottleneck / r.optimum:.1%}"),
        ("served, spread routes / optimum", f"{r.served_spread:.1f} = {r.served_spread / r.optimum:.1%}"),
        ("served, fastest route only / optimum", f"{r.served_fastest:.1f} = {r.served_fastest / r.optimum:.1%}"),
        ("hops: spread / fastest", f"{r.route_hops_spread:.1f} / {r.route_hops_fastest:.1f}"),
        ("route s/token (idle): spread / fastest", f"{r.route_latency_spread_s * 1e3:.1f} / {r.route_latency_fastest_s * 1e3:.1f} ms"),
        ("load spread (max / mean utilisation)", f"{r.load_spread:.2f}"),
        ("wall time", f"{r.wall_s:.1f} s"),
    ]
    width = max(len(a) for a, _ in rows)
    return "\n".join(f"{a:<{width}}  {b}" for a, b in rows)


def main(argv: list[str] | None = None) -> ClusterResult:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster", choices=sorted(CLUSTERS), default="helix24")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sessions", type=int, default=400, help="concurrent sessions the clients open")
    ap.add_argument("--quality", type=float, default=DEFAULT_QUALITY)
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds for the MILP optimum")
    ap.add_argument("--json", type=Path, default=None, help="default: benchmarks/results/cluster_<name>_s<seed>.json")
    a = ap.parse_args(argv)
    result = run(a.cluster, a.seed, a.sessions, a.quality, a.time_limit)
    print(format_table(result))
    out = a.json or Path(__file__).parent / "results" / f"cluster_{a.cluster}_s{a.seed}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(asdict(result), indent=1))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
