"""Where one decode token's time goes, end to end through a real `swarm-peer serve` process.

One peer serves every layer; `DistributedModel` generates greedily, one session, batch 1. In one
run it measures (medians over `--steps` tokens):

- generate: decode ms/token of `model.generate` (prefill excluded), what a user sees;
- step: one `InferenceSession.step` of one token (the hidden state there and back), no head;
- peer compute: the peer's own busy time per step (its `info` counters: the scheduler's time in
  `run_batch`, which includes the hand-off to its compute thread and, on CUDA, the graph replay);
- transport + handlers = step - peer compute; of which the bare libp2p round trip of a small frame;
- head: the client's embedding + final norm + LM head + greedy choice of one token;
- loop rest = generate - step - head: the generation loop's own bookkeeping.

On CUDA the checkpoint is the random Llama-2-7B shape of `bench_gpu_swarm.py` (written first); on
CPU a tiny random Llama. Prints a table; writes JSON to $OUT/bench_step_breakdown.json (or
benchmarks/results/). `--profile` adds py-spy profiles of the client and the peer
($OUT/breakdown-{client,peer}.txt, raw format) and a torch profiler table of the client.

    python3 benchmarks/bench_step_breakdown.py [--device cuda|cpu] [--steps 200] [--profile]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_gpu_swarm import checkpoint  # noqa: E402
from benchmarks.bench_swarm_latency import stream_round_trips  # noqa: E402
from client import DistributedModel  # noqa: E402
from client.local_swarm import LocalSwarm  # noqa: E402


def median_ms(fn, steps: int) -> float:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times[steps // 10:]) * 1e3  # the first tenth is warm-up


IDLE_GAP_S = 0.0035  # about one 7B decode step on an H200: how long threads sleep between messages


def handoff_ms(model: DistributedModel, gap: float, rounds: int = 300) -> float:
    """The caller's hand-off to the client's loop thread and back (what every `session.step` pays)."""

    async def nothing() -> None:
        return None

    times = []
    for _ in range(rounds):
        if gap:
            time.sleep(gap)
        start = time.perf_counter()
        model.loop.run(nothing())
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def generate_ms(model: DistributedModel, tokens: int) -> float:
    """Decode ms/token of `generate`, prefill excluded: (time for `tokens` - time for 1) / (tokens - 1)."""
    ids = torch.randint(3, model.model_config.vocab_size - 1, (1, 32), generator=torch.Generator().manual_seed(0))

    def timed(n: int) -> float:
        with model.inference_session(max_length=32 + n + 1) as session:
            start = time.perf_counter()
            model.generate(ids, max_new_tokens=n, session=session, eos_token_id=[])
            return time.perf_counter() - start

    timed(8)  # warm-up
    first = statistics.median(timed(1) for _ in range(3))
    full = statistics.median(timed(tokens) for _ in range(3))
    return (full - first) / (tokens - 1) * 1e3


def busy_seconds(model: DistributedModel, peer_id: str) -> float:
    return model.loop.run(model.swarm.peer_info(peer_id), timeout=60)["stats"]["busy_seconds"]


def spy(pid: int, path: Path, seconds: float) -> subprocess.Popen | None:
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        return None
    return subprocess.Popen([py_spy, "record", "--pid", str(pid), "--rate", "1000", "--duration", str(int(seconds)),
                             "--threads", "--nonblocking", "--format", "raw", "--output", str(path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measure(model: DistributedModel, peer_id: str, steps: int) -> dict[str, float]:
    head, dev = model.head, model.device
    ids = torch.tensor([7], dtype=torch.long)
    row = {}
    with model.inference_session(max_length=2 * steps + 64) as session:
        hidden = head.embed(ids)  # (1, H) on the head's device, as generate sends it
        session.step(hidden, [1])
        busy_before = busy_seconds(model, peer_id)
        row["step_ms"] = median_ms(lambda: session.step(hidden, [1]), steps)
        row["peer_compute_ms"] = (busy_seconds(model, peer_id) - busy_before) / steps * 1e3
        # generate sends each step's token ids too (peers use them for prefix sharing)
        row["step_ids_ms"] = median_ms(lambda: session.step(hidden, [1], token_ids=[[7]]), steps)
    back = torch.randn(1, model.model_config.hidden_size)  # a step's result arrives as float32 on the host

    def head_only() -> None:
        head.embed(ids)
        head.logits(back).float().argmax(dim=-1).tolist()  # what the greedy chooser does

    row["head_ms"] = median_ms(head_only, steps)
    row["generate_ms"] = generate_ms(model, min(steps, 64))
    row["device"] = str(dev)
    return row


def torch_profile(model: DistributedModel, path: Path) -> None:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    ids = torch.randint(3, model.model_config.vocab_size - 1, (1, 32))
    with model.inference_session(max_length=128) as session, profile(activities=activities) as prof:
        model.generate(ids, max_new_tokens=32, session=session, eos_token_id=[])
    path.write_text(prof.key_averages().table(sort_by="cpu_time_total", row_limit=40))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--profile", action="store_true", help="py-spy the client and peer; torch profiler table")
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="CUDA: folder of the random Llama-2-7B-shaped checkpoint, reused when it is there")
    args = parser.parse_args()
    out_dir = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-breakdown-"))
    cuda = args.device == "cuda"
    if cuda:
        model_path = args.checkpoint or work / "llama2-7b-shaped"
        checkpoint(model_path)
        peer_args, dtype, layers = ["--device", "cuda", "--dtype", "bfloat16", "--cache-tokens", "8192"], torch.bfloat16, "0:32"
    else:
        from tests.tiny_models import build_tiny_model

        model_path, peer_args, dtype, layers = build_tiny_model(work / "tiny", "llama", num_layers=6), [], torch.float32, "0:6"
    with LocalSwarm(work / "logs", {"OMP_NUM_THREADS": "1"}) as swarm:
        swarm.start_dht()
        peer = swarm.start_peer(model_path, layers, *peer_args, "--model-name", "breakdown")
        bare_ms = stream_round_trips(swarm.initial_peers, 300, 64 * 4 + 64)[0] * 1e3
        bare_idle_ms = stream_round_trips(swarm.initial_peers, 200, 64 * 4 + 64, gap=IDLE_GAP_S)[0] * 1e3
        with DistributedModel.from_pretrained(model_path, swarm.initial_peers, model_name="breakdown",
                                              device=args.device, dtype=dtype) as model:
            row = measure(model, peer.peer_id, args.steps)
            row["loop_handoff_idle_ms"] = handoff_ms(model, IDLE_GAP_S)
            row["loop_handoff_busy_ms"] = handoff_ms(model, 0.0)
            if args.profile:
                spies = [spy(pid, out_dir / f"breakdown-{who}.txt", 5) for who, pid in
                         (("client", os.getpid()), ("peer", peer.pid))]
                time.sleep(1.0)
                deadline = time.monotonic() + 4.0
                while time.monotonic() < deadline:  # bounded: ~4 s of decoding under the profilers
                    generate_ms(model, 16)
                for s in spies:
                    if s is not None:
                        s.wait(timeout=60)
                torch_profile(model, out_dir / "breakdown-client-torch.txt")
    row["bare_rtt_ms"] = bare_ms
    row["bare_rtt_after_idle_ms"] = bare_idle_ms
    row["transport_ms"] = row["step_ms"] - row["peer_compute_ms"]
    row["loop_rest_ms"] = row["generate_ms"] - row["step_ms"] - row["head_ms"]
    print(f"\none decode token on {row['device']}, 1 peer, batch 1 (medians over {args.steps} tokens), ms")
    for key, label in (("generate_ms", "generate (what a user sees)"), ("step_ms", "  step (hidden there and back)"),
                       ("step_ids_ms", "  step with token ids (as generate sends)"),
                       ("peer_compute_ms", "    peer compute (busy in run_batch)"),
                       ("transport_ms", "    transport + handlers"), ("bare_rtt_ms", "      of which bare round trip"),
                       ("bare_rtt_after_idle_ms", f"      bare round trip after {IDLE_GAP_S * 1e3:g} ms idle"),
                       ("loop_handoff_busy_ms", "    client thread -> loop -> back, back to back"),
                       ("loop_handoff_idle_ms", f"    same, after {IDLE_GAP_S * 1e3:g} ms idle"),
                       ("head_ms", "  head (embed, norm, LM head, argmax)"), ("loop_rest_ms", "  generation loop rest")):
        print(f"{label:40} {row[key]:8.3f}")
    row["date"] = time.strftime("%Y-%m-%d")
    (out_dir / "bench_step_breakdown.json").write_text(json.dumps(row, indent=2))


if __name__ == "__main__":
    main()
