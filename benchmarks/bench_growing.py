"""A growing peer's decode speed: per-layer graph chains against one graph of the range and eager.

While a GPU peer's layers arrive one by one (a join or a move, peer/moves.py) it serves the loaded
part. Eagerly that part is launch-bound; `shards.cuda_graphs.LayerGraphs` replays it as a chain of
per-layer graphs captured as each layer arrives. This measures, on random bf16 layers of a
Llama-2-7B and a Llama-2-70B shape, the decode step time of a k-layer range at batch 1 and 16 as
one whole-range graph (`DecodeGraphs`, what a peer replays once loaded), a chain, a chain over half
the layers (a peer halfway through its load) and eagerly (`Shard.forward`), and what capturing one
layer's graphs costs. The ratios to the whole-range graph are the simulator's `--growing-share`
(benchmarks/simulate_swarm.py). Prints a table and writes $OUT/bench_growing.json (or
benchmarks/results/bench_growing.json).

    PYTHONPATH=. python3 benchmarks/bench_growing.py [--context 512] [--steps 30]
"""

# The per-iteration closures below are timed inside their own iteration, so late binding is fine.
# ruff: noqa: B023
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path

import torch

from benchmarks.bench_gpu import LLAMA2_7B, random_shard, timed
from shards.batch import BatchLayout
from shards.config import ModelConfig
from shards.cuda_graphs import DecodeGraphs, LayerGraphs

LLAMA2_70B = dataclasses.replace(LLAMA2_7B, hidden_size=8192, intermediate_size=28672, num_layers=80, num_heads=64,
                                 num_kv_heads=8)
# (name, shape, layers held): a 24 GB card holds ~16 7B layers in bf16; an 80 GB one ~8 70B layers
# beside its KV cache (docs/balancing.md's GPU classes hold 4-24 layers).
SHAPES = (("llama2-7b", LLAMA2_7B, 16), ("llama2-70b", LLAMA2_70B, 8))


def bench_shape(name: str, config: ModelConfig, layers: int, batches: list[int], context: int,
                steps: int) -> list[dict]:
    shard = random_shard(dataclasses.replace(config, num_layers=layers), seed=0)
    ps = 16
    pages_per_seq = -(-(context + steps + 16) // ps)
    cache = shard.new_cache(max(batches) * pages_per_seq + 1, ps)
    for t in cache.k + cache.v:
        t.normal_()  # as if `context` tokens had been prefilled
    whole = DecodeGraphs(shard, cache, pages_per_seq, buckets=tuple(batches))
    started = time.perf_counter()
    whole.capture()
    whole_capture_s = time.perf_counter() - started
    chain = LayerGraphs(shard, cache, pages_per_seq, buckets=tuple(batches))
    capture_s = []
    for layer in range(layers):
        started = time.perf_counter()
        chain.add(layer)
        capture_s.append(time.perf_counter() - started)
    rows = []
    for B in batches:
        tables = [list(range(1 + b * pages_per_seq, 1 + (b + 1) * pages_per_seq)) for b in range(B)]
        hidden = torch.randn(B, config.hidden_size, device="cuda", dtype=torch.bfloat16)
        step = [0]

        def layout() -> BatchLayout:
            step[0] += 1
            return BatchLayout.decode([context + step[0] % steps] * B, tables, ps)

        def warm_timed(fn, iters: int) -> float:
            # Every context length once first: the eager attention kernel specialises on the key
            # count's divisibility, and a compile inside the timed loop would count as decode time.
            for _ in range(steps):
                fn()
            return timed(fn, iters)

        half = (0, layers // 2)
        ms = {
            "whole_graph": warm_timed(lambda: whole.run(hidden, layout()), steps),
            "chain": warm_timed(lambda: chain.run(hidden, layout(), (0, layers)), steps),
            "chain_half": warm_timed(lambda: chain.run(hidden, layout(), half), steps),
            "eager": warm_timed(lambda: shard(hidden, layout(), cache), max(5, steps // 3)),
            "eager_half": warm_timed(lambda: shard(hidden, layout(), cache, half), max(5, steps // 3)),
        }
        per_layer_whole = ms["whole_graph"] / layers
        row = dict(
            shape=name, layers=layers, batch=B, context=context, **{f"{k}_ms": v for k, v in ms.items()},
            # Speed per layer as a share of the whole-range graph's: what a growing peer serves at.
            chain_share=per_layer_whole / (ms["chain"] / layers),
            chain_half_share=per_layer_whole / (ms["chain_half"] / (layers // 2)),
            eager_share=per_layer_whole / (ms["eager"] / layers),
            eager_half_share=per_layer_whole / (ms["eager_half"] / (layers // 2)),
            layer_capture_s=sorted(capture_s)[len(capture_s) // 2], first_layer_capture_s=capture_s[0],
            whole_capture_s=whole_capture_s,
        )
        rows.append(row)
        print(f"  {name} {layers} layers B={B}: whole graph {ms['whole_graph']:.3f} ms, chain {ms['chain']:.3f} "
              f"(half {ms['chain_half']:.3f}), eager {ms['eager']:.2f} (half {ms['eager_half']:.2f}); "
              f"shares chain {row['chain_share']:.2f} / half {row['chain_half_share']:.2f}, eager "
              f"{row['eager_share']:.2f} / half {row['eager_half_share']:.2f}; capture per layer "
              f"{row['layer_capture_s']:.3f} s (first {capture_s[0]:.2f} s), whole {whole_capture_s:.2f} s", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, default=512, help="tokens already cached per sequence")
    ap.add_argument("--steps", type=int, default=30, help="timed decode steps per measurement")
    ap.add_argument("--batches", default="1,16", help="sequences per decode step, comma-separated")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_growing needs a CUDA device: run it on the GPU machine (benchmarks/run_gpu.sh)")
    batches = [int(b) for b in a.batches.split(",")]
    print(f"{torch.cuda.get_device_name()}: context {a.context}, batches {batches}", flush=True)
    rows = []
    for name, config, layers in SHAPES:
        rows += bench_shape(name, config, layers, batches, a.context, a.steps)
        torch.cuda.empty_cache()  # the last shape's layers, cache and graph pools went with its frame
    print(f"\n{'shape':<11} {'L':>3} {'B':>3} {'whole ms':>9} {'chain':>8} {'eager':>8} {'chain share':>12} "
          f"{'half chain':>11} {'eager share':>12} {'capture/layer s':>16}")
    for r in rows:
        print(f"{r['shape']:<11} {r['layers']:>3} {r['batch']:>3} {r['whole_graph_ms']:>9.3f} {r['chain_ms']:>8.3f} "
              f"{r['eager_ms']:>8.2f} {r['chain_share']:>12.2f} {r['chain_half_share']:>11.2f} {r['eager_share']:>12.2f} "
              f"{r['layer_capture_s']:>16.3f}")
    out_dir = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / "bench_growing.json"
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
                               "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
