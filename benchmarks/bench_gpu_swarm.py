"""GPU peers end to end, through the public CLI and client only: ms/token and tokens/s on one GPU.

A random Llama-2-7B-shaped checkpoint (vocab 49152, bf16 safetensors, sharded with an index) is
written to disk first. Then, for each setup, real `swarm-peer serve --device cuda` processes are
started (`client.local_swarm.LocalSwarm`, i.e. the command line) and `DistributedModel` generates:

- bf16, one peer 0:32; bf16, two peers 0:16 + 16:32 on the same GPU; int8 and int4, one peer;
- batch 1: decode ms per token, prefill excluded ((time for N tokens - time for 1) / (N - 1));
- 32 concurrent sessions of 2N tokens: aggregate new tokens per second from the common start
  (prefills included), and while all 32 decode (from the last first token to the first last
  token), from 16 client processes of 2 threads each (a client process is one user's Python;
  32 users are not one thread pool).
Anchors in the same run: the device's copy bandwidth (floor = weight bytes / bandwidth) and
transformers' own `generate` on the same checkpoint. Prints a table; writes JSON to
$OUT/bench_gpu_swarm.json (or benchmarks/results/).

    python3 benchmarks/bench_gpu_swarm.py [--tokens 64] [--setups bf16-1,bf16-2,int8-1,int4-1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_gpu import copy_bandwidth  # noqa: E402
from client.local_swarm import LocalSwarm  # noqa: E402

LLAMA2_7B = dict(
    hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=32, head_dim=128, vocab_size=49152, max_position_embeddings=4096,
    rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
)  # fmt: skip
SETUPS = {  # name -> (quant, layer ranges)
    "bf16-1": ("none", ["0:32"]),
    "bf16-2": ("none", ["0:16", "16:32"]),
    "int8-1": ("int8", ["0:32"]),
    "int4-1": ("int4", ["0:32"]),
}
TARGETS = {("bf16-1", "ms"): 5.0, ("bf16-2", "ms"): 5.8, ("int8-1", "ms"): 3.2, ("int4-1", "ms"): 2.2,
           ("bf16-1", "tok_s"): 4000.0}  # fmt: skip
PROMPT_TOKENS = 32
SESSIONS, CLIENT_PROCESSES = 32, 16
PEER_START_TIMEOUT = 600.0


def write_checkpoint(path: Path) -> int:
    """Random bf16 weights of the Llama-2-7B shape (4 layers per file); returns the weight bytes."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    c = LLAMA2_7B
    LlamaConfig(**c, dtype="bfloat16").save_pretrained(path)
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape: int, std: float) -> torch.Tensor:
        return (torch.randn(*shape, device="cuda", generator=gen) * std).to(torch.bfloat16).cpu()

    H, F, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    weight_map, total = {}, 0
    files: list[tuple[str, dict[str, torch.Tensor]]] = [("model-head.safetensors", {
        "model.embed_tokens.weight": rand(V, H, std=1.0), "model.norm.weight": 1 + rand(H, std=0.05),
        "lm_head.weight": rand(V, H, std=H**-0.5),
    })]  # fmt: skip
    for first in range(0, c["num_hidden_layers"], 4):
        tensors = {}
        for layer in range(first, first + 4):
            p = f"model.layers.{layer}."
            for name, shape in (("self_attn.q_proj", (H, H)), ("self_attn.k_proj", (H, H)),
                                ("self_attn.v_proj", (H, H)), ("self_attn.o_proj", (H, H)),
                                ("mlp.gate_proj", (F, H)), ("mlp.up_proj", (F, H)), ("mlp.down_proj", (H, F))):
                tensors[p + name + ".weight"] = rand(*shape, std=shape[1] ** -0.5)
            tensors[p + "input_layernorm.weight"] = 1 + rand(H, std=0.05)
            tensors[p + "post_attention_layernorm.weight"] = 1 + rand(H, std=0.05)
        files.append((f"model-layers-{first:02d}.safetensors", tensors))
    for name, tensors in files:
        save_file(tensors, str(path / name), metadata={"format": "pt"})
        for key, t in tensors.items():
            weight_map[key] = name
            total += t.numel() * t.element_size() if "layers." in key else 0
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return total


def checkpoint(path: Path) -> int:
    """The checkpoint at `path`, written first unless an earlier run left it there; its layer weight bytes."""
    if not (path / "model.safetensors.index.json").exists():
        path.mkdir(parents=True, exist_ok=True)
        return write_checkpoint(path)
    c = LLAMA2_7B
    H, F = c["hidden_size"], c["intermediate_size"]
    return c["num_hidden_layers"] * (4 * H * H + 3 * H * F + 2 * H) * 2  # bf16, what write_checkpoint counts


def prompt(seed: int) -> torch.Tensor:
    return torch.randint(3, LLAMA2_7B["vocab_size"] - 1, (1, PROMPT_TOKENS), generator=torch.Generator().manual_seed(seed))


def ms_per_token(model, tokens: int) -> float:
    """Decode time per token of one session, prefill excluded."""
    ids = prompt(0)

    def timed(n: int) -> float:
        with model.inference_session(max_length=PROMPT_TOKENS + n + 1) as session:
            start = time.perf_counter()
            model.generate(ids, max_new_tokens=n, session=session, eos_token_id=[])
            return time.perf_counter() - start

    timed(8)  # warm-up: route, streams
    firsts = sorted(timed(1) for _ in range(3))
    fulls = sorted(timed(tokens) for _ in range(3))
    return (fulls[1] - firsts[1]) / (tokens - 1) * 1e3


class TokenClock:
    """A streamer that notes when each new token of one session arrives (time.monotonic)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if self._prompt_seen:
            self.times.append(time.monotonic())
        self._prompt_seen = True  # the first put is the prompt

    def end(self) -> None:
        pass


def worker(model_path: str, initial_peers: list[str], model_name: str, threads: int, tokens: int, seed: int) -> None:
    """One client process: `threads` concurrent sessions; prints each session's token times as JSON."""
    from client import DistributedModel

    with DistributedModel.from_pretrained(model_path, initial_peers, model_name=model_name,
                                          dtype=torch.bfloat16) as model:
        model.generate(prompt(seed), max_new_tokens=4, eos_token_id=[])  # warm-up
        print("ready", flush=True)
        sys.stdin.readline()  # all workers start together
        errors: list[BaseException] = []
        clocks = [TokenClock() for _ in range(threads)]

        def run(i: int) -> None:
            try:
                model.generate(prompt(seed * 100 + i), max_new_tokens=tokens, eos_token_id=[], streamer=clocks[i])
            except BaseException as e:  # reported below
                errors.append(e)

        pool = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join(300)
        if errors:
            raise errors[0]
        print(json.dumps([c.times for c in clocks]), flush=True)


def aggregate_tokens_per_second(model_path: Path, swarm: LocalSwarm, model_name: str, tokens: int) -> tuple[float, float]:
    """(all new tokens / wall time from the common start, decode tokens/s while all sessions decode).

    The second counts only tokens that arrive between the moment the last session got its first
    token (every prefill done) and the moment the first session finished: steady-state decoding.
    """
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "worker", str(model_path), model_name, str(SESSIONS // CLIENT_PROCESSES),
             str(tokens), str(k + 1), *swarm.initial_peers],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        for k in range(CLIENT_PROCESSES)
    ]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready", "a client worker failed to start"
        started = time.monotonic()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        sessions = [times for p in procs for times in json.loads(p.stdout.readline())]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    total = sum(len(t) for t in sessions)
    overall = total / (max(t[-1] for t in sessions) - started)
    window = (max(t[0] for t in sessions), min(t[-1] for t in sessions))
    inside = sum(1 for times in sessions for t in times if window[0] < t <= window[1])
    steady = inside / (window[1] - window[0]) if window[1] > window[0] else float("nan")
    return overall, steady


def run_setup(name: str, model_path: Path, work: Path, tokens: int) -> dict:
    from client import DistributedModel

    quant, ranges = SETUPS[name]
    with LocalSwarm(work / name) as swarm:
        swarm.start_dht()
        started = time.perf_counter()
        peers = [swarm.start_peer(model_path, r, "--device", "cuda", "--dtype", "bfloat16", "--quant", quant,
                                  "--cache-tokens", "32768", "--model-name", name, wait=False) for r in ranges]
        for peer in peers:
            swarm.wait_online(peer, PEER_START_TIMEOUT)
        start_s = time.perf_counter() - started
        with DistributedModel.from_pretrained(model_path, swarm.initial_peers, model_name=name,
                                              dtype=torch.bfloat16) as model:
            assert model.device.type == "cuda"
            ms = ms_per_token(model, tokens)
            stats = [model.loop.run(model.swarm.peer_info(p.peer_id), timeout=60)["stats"] for p in peers]
        tok_s, decode_tok_s = aggregate_tokens_per_second(model_path, swarm, name, 2 * tokens)
    row = dict(setup=name, quant=quant, peers=ranges, start_s=start_s, ms=ms, tok_s=tok_s, decode_tok_s=decode_tok_s,
               graph_batches=sum(s["graph_batches"] for s in stats), eager_batches=sum(s["eager_batches"] for s in stats))
    print(f"  {name}: {ms:.2f} ms/token, {tok_s:.0f} tokens/s with {SESSIONS} sessions ({decode_tok_s:.0f} while all "
          f"decode; peers up in {start_s:.0f} s)", flush=True)
    return row


def transformers_ms_per_token(model_path: Path, tokens: int) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16).to("cuda").eval()
    ids = prompt(0).cuda()
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)

    def timed(n: int) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    timed(4)
    first = sorted(timed(1) for _ in range(3))[1]
    full = sorted(timed(tokens) for _ in range(3))[1]
    return (full - first) / (tokens - 1) * 1e3


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        _, _, path, name, threads, tokens, seed, *peers = sys.argv
        worker(path, peers, name, int(threads), int(tokens), int(seed))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--setups", default=",".join(SETUPS))
    parser.add_argument("--no-hf", action="store_true", help="Skip the transformers anchor.")
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="Folder of the random checkpoint: reused when an earlier run wrote it (default: a new "
                             "temporary folder).")
    args = parser.parse_args()
    dev = torch.cuda.get_device_properties(0)
    out_dir = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-gpu-swarm-"))
    model_path = args.checkpoint or work / "llama2-7b-shaped"
    t0 = time.perf_counter()
    weight_bytes = checkpoint(model_path)
    print(f"{dev.name}: a random Llama-2-7B-shaped checkpoint at {model_path} ({time.perf_counter() - t0:.0f} s)",
          flush=True)
    bw = copy_bandwidth()
    # bytes / (TB/s) -> ms; int8 is half the bf16 bytes, int4 group 128 about 4.25 bits per weight.
    floors = {mode: weight_bytes / ratio / (bw * 1e12) * 1e3 for mode, ratio in (("none", 1), ("int8", 2), ("int4", 3.76))}
    print(f"copy bandwidth {bw:.2f} TB/s; bf16 floor {floors['none']:.2f} ms/token", flush=True)
    rows = []
    for name in args.setups.split(","):
        try:
            rows.append(run_setup(name, model_path, work, args.tokens))
        except Exception as e:  # one broken setup must not hide the others' numbers
            print(f"  {name}: FAILED {type(e).__name__}: {e}", flush=True)
            rows.append(dict(setup=name, error=f"{type(e).__name__}: {e}"))
    hf_ms = None if args.no_hf else transformers_ms_per_token(model_path, args.tokens)
    print(f"\n{dev.name}, torch {torch.__version__}; Llama-2-7B shape, prompt {PROMPT_TOKENS}, {args.tokens} new tokens, "
          f"greedy; through swarm-peer processes and DistributedModel (head on the GPU, bf16)")
    print(f"{'setup':8} {'ms/token':>9} {'floor':>7} {'tok/s x32':>10} {'decoding':>9} {'graph/eager batches':>20}  targets")
    for r in rows:
        if "error" in r:
            print(f"{r['setup']:8} failed: {r['error']}")
            continue
        notes = []
        for kind, value in (("ms", r["ms"]), ("tok_s", r["tok_s"])):
            target = TARGETS.get((r["setup"], kind))
            if target is not None:
                met = value <= target if kind == "ms" else value >= target
                notes.append(f"{kind} {'<=' if kind == 'ms' else '>='} {target:g}: " +
                             ("met" if met else f"missed by {abs(value - target):.2f}"))
        print(f"{r['setup']:8} {r['ms']:>9.2f} {floors[r['quant']]:>7.2f} {r['tok_s']:>10.0f} {r['decode_tok_s']:>9.0f} "
              f"{r['graph_batches']:>10}/{r['eager_batches']:<9}  {'; '.join(notes)}")
    if hf_ms is not None:
        print(f"{'HF':8} {hf_ms:>9.2f}   (transformers generate, bf16, same checkpoint, one process)")
    result = dict(date=time.strftime("%Y-%m-%d"), device=dev.name, torch=torch.__version__, copy_bw_tb_s=bw,
                  weight_bytes=weight_bytes, floors_ms=floors, tokens=args.tokens, prompt_tokens=PROMPT_TOKENS,
                  sessions=SESSIONS, client_processes=CLIENT_PROCESSES, rows=rows, transformers_ms=hf_ms)
    (out_dir / "bench_gpu_swarm.json").write_text(json.dumps(result, indent=2))
    print(f"wrote {out_dir / 'bench_gpu_swarm.json'}")


if __name__ == "__main__":
    main()
