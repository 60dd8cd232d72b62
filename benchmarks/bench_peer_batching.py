"""Aggregate decode throughput of one peer (all layers of SmolLM2, CPU) vs concurrent sessions.

Starts a DHT and two `swarm-peer serve` processes of the demo model: one with continuous
batching (default) and one with `--no-batching` (one step per forward pass), under different
model names. For each session count, that many sessions open a stream each, prefill a short
prompt, then decode (random hidden states, one token per step) for `--seconds`; aggregate
tokens/s = decode steps completed by all sessions / elapsed time. Prints a table and writes
benchmarks/results/bench_peer_batching.json. Ratios are measured within one run, so they hold
even on a machine shared with other work (absolute numbers do not).

Usage: .venv/bin/python benchmarks/bench_peer_batching.py [--sessions 1 4 16 64] [--seconds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from client.local_swarm import LocalSwarm  # noqa: E402
from shards.config import ModelConfig  # noqa: E402
from shards.demo_model import prepare_demo_model  # noqa: E402
from swarm import messages as m  # noqa: E402
from swarm.codec import Limits, encode_tensor  # noqa: E402
from swarm.connection import PeerStream, open_stream  # noqa: E402
from swarm.dht import SwarmNode  # noqa: E402

PROMPT = 8


async def request_info(p2p, peer_id: str) -> dict:
    stream = await open_stream(p2p, peer_id, Limits())
    try:
        return (await stream.request({"type": m.INFO}, timeout=30))["stats"]
    finally:
        await stream.close()


async def run_sessions(p2p, peer_id: str, n: int, seconds: float, hidden_size: int) -> dict:
    gen = torch.Generator().manual_seed(n)
    prompt = encode_tensor(torch.randn(PROMPT, hidden_size, generator=gen) * 0.05)
    token = encode_tensor(torch.randn(1, hidden_size, generator=gen) * 0.05)
    streams: list[PeerStream] = []
    for _ in range(n):
        stream = await open_stream(p2p, peer_id, Limits())
        await stream.request({"type": m.OPEN, "max_length": 2048, "batch": 1}, timeout=60)
        streams.append(stream)
    await asyncio.gather(*(s.request({"type": m.STEP, "step_id": 0, "hidden": prompt, "new_tokens": [PROMPT],
                                      "positions": [0]}, timeout=600) for s in streams))
    before = await request_info(p2p, peer_id)
    latencies: list[float] = []
    counts = [0] * n
    start = time.perf_counter()
    end = start + seconds

    async def decode(i: int, stream: PeerStream) -> None:
        position = PROMPT
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            await stream.request({"type": m.STEP, "step_id": position, "hidden": token, "new_tokens": [1],
                                  "positions": [position]}, timeout=600)
            latencies.append(time.perf_counter() - t0)
            position += 1
            counts[i] += 1

    await asyncio.gather(*(decode(i, s) for i, s in enumerate(streams)))
    elapsed = time.perf_counter() - start
    after = await request_info(p2p, peer_id)
    for s in streams:
        await s.close()
    batches = after["batches_run"] - before["batches_run"]
    return {
        "sessions": n,
        "tokens": sum(counts),
        "seconds": round(elapsed, 2),
        "tokens_per_s": sum(counts) / elapsed,
        "median_step_ms": statistics.median(latencies) * 1e3 if latencies else None,
        "batches": batches,
        "mean_batch": (after["sequences_run"] - before["sequences_run"]) / max(1, batches),
        "min_session_tokens": min(counts),
    }


async def bench(swarm: LocalSwarm, peers: dict[str, str], sessions: list[int], seconds: float, hidden: int) -> list[dict]:
    node = SwarmNode(initial_peers=swarm.initial_peers, client_mode=True)
    p2p = await node.replicate_p2p()
    rows = []
    try:
        for peer_id in peers.values():
            await run_sessions(p2p, peer_id, 2, 1.0, hidden)  # warm-up
        for n in sessions:  # both modes back to back per row, so a change of machine load hits both
            for mode, peer_id in peers.items():
                row = {"mode": mode, **await run_sessions(p2p, peer_id, n, seconds, hidden)}
                print(f"  {mode:<12} {n:>3} sessions: {row['tokens_per_s']:7.1f} tok/s "
                      f"(mean batch {row['mean_batch']:.1f})", flush=True)
                rows.append(row)
    finally:
        await p2p.shutdown()
        node.shutdown()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--seconds", type=float, default=8.0, help="decode time per measurement")
    # One torch thread: on a shared 2-core machine, 2 threads make every op above ~32k elements wait
    # for a descheduled OpenMP thread (a 24-token batch took 3.6 s instead of 0.15 s when measured).
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the peers (0: torch default)")
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/bench_peer_batching.json"))
    args = parser.parse_args()
    model = prepare_demo_model()
    hidden = ModelConfig.from_pretrained(model).hidden_size
    load = os.getloadavg()
    common = ["--cache-tokens", str(max(args.sessions) * 512), "--num-threads", str(args.threads),
              "--log-level", "warning"]
    with tempfile.TemporaryDirectory() as logs, LocalSwarm(Path(logs)) as swarm:
        swarm.start_dht()
        batched = swarm.start_peer(model, "0:30", "--model-name", "bench-batched", *common)
        single = swarm.start_peer(model, "0:30", "--model-name", "bench-single", "--no-batching", *common)
        print(f"peers online; load average before: {load[0]:.1f} on {os.cpu_count()} cores", flush=True)
        rows = asyncio.run(bench(swarm, {"batching": batched.peer_id, "no-batching": single.peer_id},
                                 args.sessions, args.seconds, hidden))
    base = {r["mode"]: r["tokens_per_s"] for r in rows if r["sessions"] == args.sessions[0]}
    print(f"\nSmolLM2-135M, all 30 layers on one CPU peer, float32, {args.seconds:.0f} s of decoding per row")
    print(f"{'sessions':>8} | {'batching tok/s':>14} {'x vs 1':>7} {'mean batch':>10} {'step ms':>8} | "
          f"{'no-batching tok/s':>17} {'x vs 1':>7}")
    for n in args.sessions:
        b = next(r for r in rows if r["mode"] == "batching" and r["sessions"] == n)
        s = next(r for r in rows if r["mode"] == "no-batching" and r["sessions"] == n)
        print(f"{n:>8} | {b['tokens_per_s']:>14.1f} {b['tokens_per_s'] / base['batching']:>6.1f}x "
              f"{b['mean_batch']:>10.1f} {b['median_step_ms']:>8.0f} | {s['tokens_per_s']:>17.1f} "
              f"{s['tokens_per_s'] / base['no-batching']:>6.1f}x")
    end_load = os.getloadavg()
    print(f"load average {load[0]:.1f} before, {end_load[0]:.1f} after ({os.cpu_count()} cores, shared machine)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "date": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.processor() or platform.machine(),
        "cores": os.cpu_count(), "load_before": load, "load_after": end_load, "seconds": args.seconds,
        "torch_threads": args.threads, "rows": rows,
    }, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
