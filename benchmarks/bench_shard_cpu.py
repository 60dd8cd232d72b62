"""CPU decode-step time of one Shard (all layers) vs transformers + DynamicCache, per model shape.

Models: SmolLM2-135M (llama), a Mixtral-shaped mixture of experts (8 experts, top-2) and a
Gemma-2-shaped model (sandwich norms, soft-capping, a 64-token sliding window on every other
layer, so a 128-token context runs past it). The last two are random checkpoints saved by
transformers into a temporary folder: speed does not depend on the weights' values.
Both sides run only the decoder stack (transformers: `model.model`, i.e. layers + final norm;
no LM head) on the same hidden states, with ~128 tokens of context per sequence.

    .venv/bin/python benchmarks/bench_shard_cpu.py [--steps 30] [--context 128] [--models smollm2,moe,gemma2]

Prints a table (and the machine's load average before and after: on a shared machine, other
processes' load decides how far the figures can be trusted) and writes
benchmarks/results/bench_shard_cpu.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

from shards import BatchLayout, ModelConfig, PagePool, PageTable, Shard
from shards.demo_model import prepare_demo_model

RESULTS = Path(__file__).parent / "results" / "bench_shard_cpu.json"
_SHAPE = dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
              vocab_size=1024, max_position_embeddings=4096, pad_token_id=0, bos_token_id=1, eos_token_id=2)
SHAPES = {  # model_type and its sizes, beside the common _SHAPE
    "moe": ("mixtral", dict(intermediate_size=1024, num_local_experts=8, num_experts_per_tok=2)),
    "gemma2": ("gemma2", dict(intermediate_size=2048, sliding_window=64, query_pre_attn_scalar=64)),
}


def model_path(name: str, folder: Path) -> Path:
    """The checkpoint folder of a --models entry (random shapes are saved into `folder`)."""
    if name == "smollm2":
        return prepare_demo_model()
    model_type, sizes = SHAPES[name]
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **_SHAPE, **sizes)
    path = folder / name
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    return path


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
    ap.add_argument("--models", default="smollm2,moe,gemma2", help="comma-separated: smollm2, moe, gemma2")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            path = model_path(name, Path(tmp))
            print(f"{name}: {path}", flush=True)
            rows += bench_model(name, path, args)
    report(rows, args, {"before": load_before, "after": os.getloadavg()})


def bench_model(model_name: str, path: Path, args: argparse.Namespace) -> list[dict]:
    shard = Shard.from_pretrained(path, 0, ModelConfig.from_pretrained(path).num_layers)
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
        for impl, t in time_interleaved(cases, args.steps, args.warmup).items():
            median = statistics.median(t)
            rows.append(
                {"model": model_name, "impl": impl, "batch": batch, "context": args.context, "median_ms": 1e3 * median,
                 "p90_ms": 1e3 * sorted(t)[int(0.9 * (len(t) - 1))], "tokens_per_s": batch / median}
            )
    return rows


def report(rows: list[dict], args: argparse.Namespace, load: dict[str, tuple[float, float, float]]) -> None:
    print(f"{'model':<8} {'impl':<30} {'batch':>5} {'ctx':>5} {'median ms':>10} {'p90 ms':>8} {'tok/s':>8}")
    for r in rows:
        print(f"{r['model']:<8} {r['impl']:<30} {r['batch']:>5} {r['context']:>5} {r['median_ms']:>10.2f} "
              f"{r['p90_ms']:>8.2f} {r['tokens_per_s']:>8.1f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
        "torch": torch.__version__,
        "models": "float32, all layers: SmolLM2-135M-Instruct; moe = mixtral 4 layers, hidden 512, 8 experts "
                  "(1024) top-2; gemma2 = 4 layers, hidden 512, MLP 2048, window 64 on layers 0 and 2",
        "steps": args.steps,
        "warmup": args.warmup,
        "load_average_1_5_15min": load,
    }
    print("load average (1, 5, 15 min): " + ", ".join(f"{k} {' '.join(f'{x:.2f}' for x in v)}" for k, v in load.items()))
    RESULTS.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
