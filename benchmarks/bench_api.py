"""What the `swarm-api` gateway adds: streaming chat through HTTP vs `DistributedModel.generate`.

Starts a local SmolLM2-135M-Instruct swarm (bootstrap DHT + peers 0:15 and 15:30, one torch
thread each), the gateway (`python -m client.api.cli`) and an in-process `DistributedModel`.
For each concurrency (default 1, 8, 32) it runs the same greedy chat prompts twice, back to
back: directly with `generate` on threads (a streamer timestamps each token) and as streaming
requests through the gateway (aiohttp client, SSE chunk timestamps). Prints p50/p95 time to
first token, p50/p95 inter-token latency and aggregate tokens/s; writes JSON to
benchmarks/results/bench_api.json. `--mixed` concurrencies (default 8) run again with half the
streams through each path at the same time: both halves share the peers' batches and the
machine's load, so on a busy machine that comparison is the fair one.

    .venv/bin/python -m benchmarks.bench_api --max-tokens 32 --concurrency 1 8 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Trace:
    """One request: when it was sent and when each token arrived (perf_counter seconds)."""

    sent: float
    tokens: list[float] = field(default_factory=list)


@dataclass
class Row:
    mode: str
    concurrency: int
    requests: int
    tokens: int
    wall_s: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    itl_p50_ms: float
    itl_p95_ms: float
    tokens_per_s: float
    mixed: bool  # run at the same time as the other mode's half (concurrency counts both halves)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def summarize(mode: str, concurrency: int, traces: list[Trace], wall: float, mixed: bool = False) -> Row:
    ttft = [(t.tokens[0] - t.sent) * 1000 for t in traces if t.tokens]
    itl = [(b - a) * 1000 for t in traces for a, b in zip(t.tokens, t.tokens[1:])]
    tokens = sum(len(t.tokens) for t in traces)
    return Row(mode, concurrency, len(traces), tokens, round(wall, 3), round(pct(ttft, 0.5), 1),
               round(pct(ttft, 0.95), 1), round(pct(itl, 0.5), 1), round(pct(itl, 0.95), 1), round(tokens / wall, 2), mixed)


def prompts(n: int) -> list[list[dict[str, str]]]:
    topics = ["rivers", "bread", "the moon", "bicycles", "owls", "glass", "tea", "volcanoes"]
    return [[{"role": "user", "content": f"Write a short paragraph about {topics[i % len(topics)]} (#{i})."}]
            for i in range(n)]


class TimingStreamer:
    """A generate() streamer that timestamps every new token (the first put is the prompt)."""

    def __init__(self, trace: Trace) -> None:
        self.trace, self.seen_prompt = trace, False

    def put(self, ids: Any) -> None:
        if self.seen_prompt:
            self.trace.tokens.append(time.perf_counter())
        self.seen_prompt = True

    def end(self) -> None:
        pass


def run_direct(model: Any, chats: list[list[dict[str, str]]], max_tokens: int) -> tuple[list[Trace], float]:
    tok = model.tokenizer
    inputs = []
    for chat in chats:
        ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt")
        inputs.append(ids if hasattr(ids, "shape") else ids["input_ids"])
    traces = [Trace(0.0) for _ in chats]
    start = threading.Barrier(len(chats) + 1)

    def one(i: int) -> None:
        start.wait()
        traces[i].sent = time.perf_counter()
        model.generate(inputs[i], max_new_tokens=max_tokens, do_sample=False, streamer=TimingStreamer(traces[i]))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(chats))]
    for t in threads:
        t.start()
    start.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    return traces, time.perf_counter() - began


async def run_gateway(url: str, name: str, chats: list[list[dict[str, str]]], max_tokens: int) -> tuple[list[Trace], float]:
    import aiohttp

    async def one(session: aiohttp.ClientSession, chat: list[dict[str, str]]) -> Trace:
        body = {"model": name, "messages": chat, "max_tokens": max_tokens, "temperature": 0, "stream": True}
        trace = Trace(time.perf_counter())
        async with session.post(url + "/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            async for line in r.content:  # one SSE line at a time
                if line.startswith(b"data: {"):
                    choice = (json.loads(line[6:])["choices"] or [{}])[0]
                    if choice.get("delta", {}).get("content"):
                        trace.tokens.append(time.perf_counter())
        return trace

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600),
                                     connector=aiohttp.TCPConnector(limit=0)) as session:
        began = time.perf_counter()
        traces = await asyncio.gather(*(one(session, chat) for chat in chats))
        return list(traces), time.perf_counter() - began


def run_mixed(model: Any, url: str, name: str, chats: list[list[dict[str, str]]],
              max_tokens: int) -> tuple[tuple[list[Trace], float], tuple[list[Trace], float]]:
    """Half the chats through `generate`, half through the gateway, at the same time: both halves
    share the peers' batches and the machine's load, so their difference is the gateway's own cost."""
    half = len(chats) // 2
    through_gateway: list[tuple[list[Trace], float]] = []
    thread = threading.Thread(target=lambda: through_gateway.append(
        asyncio.run(run_gateway(url, name, chats[half:], max_tokens))))
    thread.start()
    direct = run_direct(model, chats[:half], max_tokens)
    thread.join()
    return direct, through_gateway[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=32, help="Tokens per answer (greedy; EOS may end earlier).")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32], help="Concurrent requests per run.")
    parser.add_argument("--mixed", type=int, nargs="*", default=[8],
                        help="Concurrencies also run mixed: half generate, half gateway at once (robust to load).")
    args = parser.parse_args()

    from client import DistributedModel
    from client.api.process import GatewayProcess
    from client.local_swarm import LocalSwarm
    from shards.demo_model import prepare_demo_model

    model_path = prepare_demo_model()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-api-"))
    rows: list[Row] = []
    with LocalSwarm(log_dir, {"OMP_NUM_THREADS": "1"}) as swarm:
        swarm.start_dht()
        peers = [swarm.start_peer(model_path, r, wait=False) for r in ("0:15", "15:30")]
        gateway = GatewayProcess(model_path, swarm.initial_peers[0], log_dir / "api.log")
        url = gateway.url
        try:
            for peer in peers:
                swarm.wait_online(peer)
            with DistributedModel.from_pretrained(model_path, swarm.initial_peers) as model:
                name = model.model_name
                run_direct(model, prompts(1), 4)  # warm-up: routes, connections, first-call costs
                asyncio.run(run_gateway(url, name, prompts(1), 4))
                for c in args.concurrency:
                    chats = prompts(c)
                    traces, wall = run_direct(model, chats, args.max_tokens)
                    rows.append(summarize("generate", c, traces, wall))
                    traces, wall = asyncio.run(run_gateway(url, name, chats, args.max_tokens))
                    rows.append(summarize("gateway", c, traces, wall))
                    print(f"  done: {c} concurrent", file=sys.stderr, flush=True)
                for c in args.mixed:
                    (traces, wall), (gw_traces, gw_wall) = run_mixed(model, url, name, prompts(c), args.max_tokens)
                    rows.append(summarize("generate", c, traces, wall, mixed=True))
                    rows.append(summarize("gateway", c, gw_traces, gw_wall, mixed=True))
                    print(f"  done: {c} mixed", file=sys.stderr, flush=True)
        finally:
            gateway.stop()

    header = f"{'mode':9} {'conc':>4} {'tokens':>6} {'TTFT p50':>9} {'TTFT p95':>9} {'ITL p50':>8} {'ITL p95':>8} {'tok/s':>7}"
    print(header)
    for r in rows:  # a mixed run's concurrency shows as "4+4"
        conc = f"{r.concurrency // 2}+{r.concurrency - r.concurrency // 2}" if r.mixed else str(r.concurrency)
        print(f"{r.mode:9} {conc:>4} {r.tokens:6d} {r.ttft_p50_ms:8.1f}ms {r.ttft_p95_ms:8.1f}ms "
              f"{r.itl_p50_ms:7.1f}ms {r.itl_p95_ms:7.1f}ms {r.tokens_per_s:7.1f}")
    overhead = {}
    for c, mixed in [*((c, False) for c in args.concurrency), *((c, True) for c in args.mixed)]:
        direct, gw = (next(r for r in rows if (r.mode, r.concurrency, r.mixed) == (m, c, mixed))
                      for m in ("generate", "gateway"))
        key = f"{c} mixed" if mixed else str(c)
        overhead[key] = round((gw.itl_p50_ms / direct.itl_p50_ms - 1) * 100, 1)
        print(f"gateway inter-token overhead at {key} streams (p50): {overhead[key]:+.1f}%")
    load = [round(x, 1) for x in os.getloadavg()]
    print(f"load average at the end: {load} on {os.cpu_count()} CPUs (other work on the machine skews the runs)")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "bench_api.json"
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": platform.platform(),
                               "cpus": os.cpu_count(), "load_average": load, "max_tokens": args.max_tokens,
                               "rows": [asdict(r) for r in rows], "itl_overhead_pct": overhead}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
