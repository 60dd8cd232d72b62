"""Soak: 1,000 sequential and 200 concurrent sessions against one peer; its memory must not grow.

Reports the peer's resident memory (RSS, the peer process itself) and KV pages in use at the
start, the middle and the end of each phase. Prints a table and writes JSON.

    .venv/bin/python benchmarks/soak_peer.py [--sequential 1000] [--concurrent 200]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from client import DistributedModel  # noqa: E402
from client.local_swarm import LocalSwarm  # noqa: E402


def peer_state(model: DistributedModel, peer_pid: int, peer_id: str) -> dict:
    reply = model.loop.run(model.swarm.peer_info(peer_id), timeout=60)
    record = reply["record"]
    return {"rss_mb": psutil.Process(peer_pid).memory_info().rss / 2**20,
            "pages_used": record["total_pages"] - record["free_pages"], "sessions": reply["stats"]["sessions"]}


def one_session(model: DistributedModel, seed: int) -> None:
    prompt = torch.randint(3, 300, (1, 8 + seed % 24), generator=torch.Generator().manual_seed(seed))
    model.generate(prompt, max_new_tokens=4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequential", type=int, default=1000)
    parser.add_argument("--concurrent", type=int, default=200)
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/soak_peer.json"))
    args = parser.parse_args()
    from tests.tiny_models import build_tiny_model

    work = Path(tempfile.mkdtemp(prefix="soak-"))
    model_path = build_tiny_model(work / "tiny", "llama", num_layers=4)
    samples: list[dict] = []
    with LocalSwarm(work / "logs", {"OMP_NUM_THREADS": "1"}) as swarm:
        peer = swarm.start_peer(model_path, "0:4", "--max-sessions", "512", "--max-sessions-per-remote", "512",
                                "--cache-tokens", "16384")
        with DistributedModel.from_pretrained(model_path, peer.maddrs) as model:
            def sample(label: str) -> None:
                time.sleep(1.0)  # sessions close asynchronously on the peer
                samples.append({"when": label, **peer_state(model, peer.pid, peer.peer_id)})

            one_session(model, 0)  # warm-up: imports, allocator, first route
            sample("start")
            started = time.perf_counter()
            for i in range(args.sequential):
                one_session(model, i)
                if i == args.sequential // 2:
                    sample("sequential middle")
            sequential_s = time.perf_counter() - started
            sample("sequential end")
            errors: list[BaseException] = []

            def worker(i: int) -> None:
                try:
                    one_session(model, 10_000 + i)
                except BaseException as e:  # reported below
                    errors.append(e)

            threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.concurrent)]
            started = time.perf_counter()
            for t in threads[: args.concurrent // 2]:
                t.start()
            for t in threads[: args.concurrent // 2]:
                t.join(timeout=600)
            sample("concurrent middle")
            for t in threads[args.concurrent // 2 :]:
                t.start()
            for t in threads[args.concurrent // 2 :]:
                t.join(timeout=600)
            concurrent_s = time.perf_counter() - started
            sample("concurrent end")
    print(f"soak of one tiny-model peer: {args.sequential} sequential sessions in {sequential_s:.0f} s, "
          f"{args.concurrent} concurrent in {concurrent_s:.0f} s, {len(errors)} errors")
    print(f"{'when':<20} {'RSS MB':>8} {'KV pages used':>14} {'sessions':>9}")
    for s in samples:
        print(f"{s['when']:<20} {s['rss_mb']:>8.1f} {s['pages_used']:>14} {s['sessions']:>9}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "samples": samples, "errors": len(errors),
                                     "sequential_s": sequential_s, "concurrent_s": concurrent_s}, indent=2))


if __name__ == "__main__":
    main()
