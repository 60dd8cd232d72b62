"""GPU decode benchmark: one peer serving all 32 layers of a Llama-2-7B-shaped random model.

Measures, in one run: the copy-bandwidth floor, our Shard decode (eager `Shard.forward`, and
`DecodeGraphs` replays) for quant none/int8/int4 at batch 1 and 32, and transformers'
`LlamaModel` forward (eager, DynamicCache) as an anchor. Prints a table and writes JSON to
$OUT/bench_gpu.json (or benchmarks/results/bench_gpu.json).

    PYTHONPATH=. python3 benchmarks/bench_gpu.py [--context 512] [--steps 50]
"""

# The per-iteration closures below are timed inside their own iteration, so late binding is fine.
# ruff: noqa: B023
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from shards.batch import BatchLayout
from shards.config import ModelConfig
from shards.cuda_graphs import DecodeGraphs
from shards.quant import memory_plan, quantize_shard
from shards.shard import Shard

LLAMA2_7B = ModelConfig(
    hidden_size=4096, intermediate_size=11008, num_layers=32, num_heads=32, num_kv_heads=32, head_dim=128,
    rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None, vocab_size=32000, tie_word_embeddings=False,
    attention_bias=False, max_position_embeddings=4096, model_type="llama", torch_dtype="bfloat16",
)  # fmt: skip
TARGETS_MS = {("none", 1): 4.4, ("int8", 1): 2.6, ("int4", 1): 1.6}
TARGET_TOK_S = {("none", 32): 4000}


@torch.no_grad()
def random_shard(config: ModelConfig, seed: int) -> Shard:
    """All of `config`'s layers in bf16 on the GPU, with seeded random weights drawn there."""
    shard = Shard(config, 0, config.num_layers, torch.bfloat16, torch.device("cuda"))
    shard.blocks.to_empty(device="cuda").to(torch.bfloat16)
    torch.manual_seed(seed)
    for name, p in shard.blocks.named_parameters():
        if "norm" in name:
            p.normal_(1.0, 0.05)
        else:
            p.normal_(0.0, 0.02)
    return shard.eval()


def timed(fn, iters: int) -> float:
    """Median-free wall time per call in ms (events around `iters` calls after 3 warm-ups)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / iters


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second (TB/s)."""
    n = 1 << 30  # 2 GiB of bf16 each way
    src, dst = (
        torch.randn(n, device="cuda", dtype=torch.bfloat16),
        torch.empty(n, device="cuda", dtype=torch.bfloat16),
    )
    ms = min(timed(lambda: dst.copy_(src), 20) for _ in range(3))
    return 2 * n * 2 / ms / 1e9


def bench_shard(mode: str, context: int, steps: int, batches: list[int], bw: float) -> list[dict]:
    cfg = LLAMA2_7B
    shard = random_shard(cfg, seed=0)
    t0 = time.time()
    quantize_shard(shard, mode, 128)
    quant_s = time.time() - t0
    ps = 16
    pages_per_seq = -(-(context + steps + 16) // ps)
    cache = shard.new_cache(max(batches) * pages_per_seq + 1, ps)
    for t in cache.k + cache.v:
        t.normal_()  # as if `context` tokens had been prefilled; never zeros
    plan = memory_plan(cfg, cfg.num_layers, mode, torch.bfloat16, 0)
    graphs = DecodeGraphs(shard, cache, pages_per_seq, buckets=tuple(batches))
    t0 = time.time()
    graphs.capture()
    capture_s = time.time() - t0
    rows = []
    for B in batches:
        tables = [list(range(1 + b * pages_per_seq, 1 + (b + 1) * pages_per_seq)) for b in range(B)]
        hidden = torch.randn(B, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
        step = [0]

        def graph_step() -> None:
            graphs.run(hidden, BatchLayout.decode([context + step[0] % steps] * B, tables, ps))
            step[0] += 1

        def eager_step() -> None:
            shard(hidden, BatchLayout.decode([context + step[0] % steps] * B, tables, ps), cache)
            step[0] += 1

        graph_ms = timed(graph_step, steps)
        graph_obj = graphs.graphs[B][0]
        replay_ms = timed(graph_obj.replay, steps)
        eager_ms = timed(eager_step, max(5, steps // 5))
        kv_bytes = B * (context + steps // 2) * 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2
        floor_ms = (plan["weight_bytes"] + kv_bytes) / (bw * 1e9)
        rows.append(
            dict(
                quant=mode, batch=B, context=context, weight_gb=plan["weight_bytes"] / 1e9, kv_gb=kv_bytes / 1e9,
                floor_ms=floor_ms, graph_ms=graph_ms, replay_ms=replay_ms, eager_ms=eager_ms,
                tok_s=B / graph_ms * 1e3, eff_bw_tb_s=(plan["weight_bytes"] + kv_bytes) / graph_ms / 1e9,
                quantize_s=quant_s, capture_s=capture_s,
            )
        )  # fmt: skip
        print(
            f"  {mode} B={B}: graph {graph_ms:.3f} ms (replay {replay_ms:.3f}), eager {eager_ms:.2f} ms, floor {floor_ms:.3f}",
            flush=True,
        )
    return rows


@torch.no_grad()
def bench_transformers(context: int, steps: int, batches: list[int]) -> list[dict]:
    from transformers import DynamicCache, LlamaConfig, LlamaModel

    c = LLAMA2_7B
    hf = LlamaConfig(
        hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads, vocab_size=c.vocab_size,
        max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
    )  # fmt: skip
    hf._attn_implementation = "eager"
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = LlamaModel(hf).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    rows = []
    for B in batches:
        ids = torch.randint(0, c.vocab_size, (B, context), device="cuda")
        pkv = DynamicCache()
        model(input_ids=ids, past_key_values=pkv, use_cache=True)
        tok = ids[:, -1:]

        def step() -> None:
            model(input_ids=tok, past_key_values=pkv, use_cache=True)

        ms = timed(step, steps // 2)
        rows.append(
            dict(impl="transformers LlamaModel (eager)", batch=B, context=context, ms=ms, tok_s=B / ms * 1e3)
        )
        print(f"  transformers B={B}: {ms:.3f} ms/step", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--modes", default="none,int8,int4")
    ap.add_argument("--no-hf", action="store_true")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    dev = torch.cuda.get_device_properties(0)
    print(f"{dev.name}, {dev.multi_processor_count} SMs, torch {torch.__version__}", flush=True)
    bw = copy_bandwidth()
    print(f"copy bandwidth (read+write): {bw:.2f} TB/s", flush=True)
    rows = []
    for mode in args.modes.split(","):
        rows += bench_shard(mode, args.context, args.steps, batches, bw)
        torch.cuda.empty_cache()  # the shard, cache and graphs died with bench_shard's frame
    hf_rows = [] if args.no_hf else bench_transformers(args.context, args.steps, batches)

    print(f"\nLlama-2-7B shape, 32 layers on one peer, bf16 activations, context {args.context}, {dev.name}")
    print(f"{'quant':6} {'B':>3} {'weights GB':>10} {'floor ms':>9} {'graph ms':>9} {'replay ms':>9} {'eager ms':>9} "
          f"{'tok/s':>8} {'eff TB/s':>8}  target")  # fmt: skip
    for r in rows:
        key = (r["quant"], r["batch"])
        tgt = ""
        if key in TARGETS_MS:
            t = TARGETS_MS[key]
            miss = r["graph_ms"] - t
            tgt = f"<= {t} ms: " + ("met" if miss <= 0 else f"missed by {miss:.2f} ms")
        if key in TARGET_TOK_S:
            t = TARGET_TOK_S[key]
            miss = t - r["tok_s"]
            tgt = f">= {t} tok/s: " + ("met" if miss <= 0 else f"missed by {miss:.0f} tok/s")
        print(f"{r['quant']:6} {r['batch']:>3} {r['weight_gb']:>10.2f} {r['floor_ms']:>9.3f} {r['graph_ms']:>9.3f} "
              f"{r['replay_ms']:>9.3f} {r['eager_ms']:>9.2f} {r['tok_s']:>8.0f} {r['eff_bw_tb_s']:>8.2f}  {tgt}")  # fmt: skip
    for r in hf_rows:
        print(
            f"{'HF':6} {r['batch']:>3} {'':>10} {'':>9} {r['ms']:>9.3f} {'':>9} {'':>9} {r['tok_s']:>8.0f}  (transformers eager anchor)"
        )
    out_dir = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    result = dict(
        device=dev.name,
        copy_bw_tb_s=bw,
        torch=torch.__version__,
        context=args.context,
        shard=rows,
        transformers=hf_rows,
    )
    (out_dir / "bench_gpu.json").write_text(json.dumps(result, indent=2))
    print(f"wrote {out_dir / 'bench_gpu.json'}")


if __name__ == "__main__":
    main()
