"""CPU decode-step time of one Shard (SmolLM2-135M, all 30 layers) vs transformers + DynamicCache.

Both sides run only the decoder stack (transformers: `model.model`, i.e. layers + final norm;
no LM head) on the same hidden states, with ~128 tokens of context per sequence.

    .venv/bin/python benchmarks/bench_shard_cpu.py [--steps 30] [--context 128]

Prints a table and writes benchmarks/results/bench_shard_cpu.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from shards import BatchLayout, PagePool, PageTable, Shard
from shards.demo_model import prepare_demo_model

RESULTS = Path(__file__).parent / "results" / "bench_shard_cpu.json"


def time_interleaved(steps_by_name: dict[str, Callable[[], None]], steps: int, warmup: int) -> dict[str, list[float]]:
    """Alternate the implementations step by step, so load from other processes hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in steps_by_name}
    for i in range(warmup + steps):
        for name, step in steps_by_name.items():
            t0 = time.perf_counter()
            step()
            if i >= warmup:
                times[name].append(time.perf_counter() - t0)
    return times


def shard_step(shard: Shard, contexts: list[int], max_steps: int, page_size: int = 16) -> Callable[[], None]:
    """Prefill each sequence to its context; return one batched decode step (layout build included)."""
    H = shard.config.hidden_size
    pages_each = -(-(max(contexts) + max_steps) // page_size)
    pool = PagePool(pages_each * len(contexts), page_size)
    cache = shard.new_cache(pool.num_pages, page_size)
    tables = [PageTable() for _ in contexts]
    for t, c in zip(tables, contexts):
        assert t.reserve(pool, c)
    g = torch.Generator().manual_seed(0)
    prefill = BatchLayout(list(contexts), [0] * len(contexts), [t.pages for t in tables], page_size)
    shard(torch.randn(sum(contexts), H, generator=g), prefill, cache)
    x = torch.randn(len(contexts), H, generator=g)  # (B, H)

    def step() -> None:
        cached = [t.length for t in tables]
        for t in tables:
            assert t.reserve(pool, t.length + 1)
        shard(x, BatchLayout.decode(cached, [t.pages for t in tables], page_size), cache)

    return step


def transformers_step(model, batch: int, context: int) -> Callable[[], None]:
    """Prefill `model.model` with a DynamicCache; return one decode step."""
    H = model.config.hidden_size
    g = torch.Generator().manual_seed(0)
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model.model(inputs_embeds=torch.randn(batch, context, H, generator=g), cache=cache, use_cache=True)
    x = torch.randn(batch, 1, H, generator=g)  # (B, 1, H)

    def step() -> None:
        with torch.inference_mode():
            model.model(inputs_embeds=x, cache=cache, use_cache=True)

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    path = prepare_demo_model()
    shard = Shard.from_pretrained(path, 0, 30)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    rows = []
    total = args.steps + args.warmup
    for batch in (1, 8):
        cases = {
            "layerswarm Shard": shard_step(shard, [args.context] * batch, total),
            "transformers": transformers_step(model, batch, args.context),
        }
        if batch > 1:  # a ragged batch (contexts 64..192) only the paged shard can express without padding
            ragged = [args.context // 2 + i * args.context // (batch - 1) for i in range(batch)]
            cases["layerswarm Shard, ragged ctx"] = shard_step(shard, ragged, total)
        for name, t in time_interleaved(cases, args.steps, args.warmup).items():
            median = statistics.median(t)
            rows.append(
                {"impl": name, "batch": batch, "context": args.context, "median_ms": 1e3 * median,
                 "p90_ms": 1e3 * sorted(t)[int(0.9 * (len(t) - 1))], "tokens_per_s": batch / median}
            )

    print(f"{'impl':<30} {'batch':>5} {'ctx':>5} {'median ms':>10} {'p90 ms':>8} {'tok/s':>8}")
    for r in rows:
        print(f"{r['impl']:<30} {r['batch']:>5} {r['context']:>5} {r['median_ms']:>10.2f} {r['p90_ms']:>8.2f} {r['tokens_per_s']:>8.1f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
        "torch": torch.__version__,
        "model": "SmolLM2-135M-Instruct float32, layers 0:30",
        "steps": args.steps,
        "warmup": args.warmup,
    }
    RESULTS.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
