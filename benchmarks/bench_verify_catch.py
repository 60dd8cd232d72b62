"""How often client verification catches a quiet liar: lie rate x verify fraction x honest replicas.

Starts a DHT, two honest `swarm-peer serve` processes and one liar (hidden `--faulty STD
--faulty-probability P`: Gaussian noise on P of its results), all serving layers 0:4 of the demo
model (SmolLM2-135M) under one model name. For each lie probability the liar is restarted; for
each verify fraction and replica count (1: the second honest peer is excluded from the client's
view), the client runs sequences through the liar with the real `HopSession` (prefill 8 real
token embeddings, then decode one token per step) and, on a random `verify` share of the steps,
the real `client.verify.check_step` that `InferenceSession` runs. Ground truth: each result is
compared with a local `Shard` of the same layers (a lie differs by far more than float32 noise).

Counted per configuration: lies told; lies rejected (the session would not use the output and
recomputes elsewhere); liar identified (distrusted and reported); inconclusive checks; honest
steps rejected (false alarms); P(liar identified within a 100-token generation) =
1 - (1 - identified/steps)^100. "old check" is the share of lies that the previous check (one
whole-step scale, tolerance 1e-3 * (1 + max |b|)) would have flagged even on a verified step.

Usage: .venv/bin/python benchmarks/bench_verify_catch.py [--steps 200] [--std 0.05] [--seed 0]
Writes benchmarks/results/bench_verify_catch.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from client.config import ClientConfig  # noqa: E402
from client.hop import HopSession  # noqa: E402
from client.local_swarm import LocalSwarm  # noqa: E402
from client.model import DistributedModel  # noqa: E402
from client.verify import check_step, row_errors  # noqa: E402
from shards.batch import BatchLayout  # noqa: E402
from shards.demo_model import prepare_demo_model  # noqa: E402
from shards.shard import Shard  # noqa: E402
from swarm.types import LayerRange  # noqa: E402

NAME = "verify-bench"
LAYERS = LayerRange(0, 4)
PROMPT, SEQ = 8, 32  # tokens per sequence: one 8-token prefill, then 24 decode steps


def old_check_flags(y: torch.Tensor, honest: torch.Tensor) -> bool:
    """The previous comparison: one scale for the whole step (float32 tolerance 1e-3)."""
    return float((y - honest).abs().max()) > 1e-3 * (1.0 + float(honest.abs().max()))


async def run_config(model: DistributedModel, shard: Shard, liar: str, verify: float, steps: int,
                     rng: random.Random) -> dict:
    swarm = model.swarm
    view = await swarm.view(fresh=True)
    counts = dict(steps=0, lies=0, rejected=0, identified=0, inconclusive=0, false_alarms=0, old_check=0,
                  verified=0, verified_lies=0)
    vocab = model.model_config.vocab_size
    step_id = 0
    while counts["steps"] < steps:
        hop = HopSession(view.records[liar], LAYERS, batch=1, max_length=SEQ)
        await hop.open(swarm.open_stream, 30)
        ids = torch.tensor([rng.randrange(100, min(vocab, 20_000)) for _ in range(SEQ)])
        inputs = model.head.embed(ids).float()  # (SEQ, H): real layer-0 hidden states
        position = 0
        try:
            while position < SEQ and counts["steps"] < steps:
                n = PROMPT if position == 0 else 1
                x = inputs[position : position + n]
                step_id += 1
                await hop.send_step(x, [n], step_id)
                y = await hop.recv_result(step_id, 30)
                full = inputs[: position + n]
                truth = shard.forward(full, BatchLayout([full.shape[0]], [0], None, 16), None)[-n:]
                lie = bool(row_errors(y, truth).max() > 1e-5)  # honest float32: ~1e-6
                counts["steps"] += 1
                counts["lies"] += lie
                counts["old_check"] += lie and old_check_flags(y, truth)
                if rng.random() < verify:
                    counts["verified"] += 1
                    counts["verified_lies"] += lie
                    verdict = await check_step(swarm, hop, x, [n], y)
                    counts["identified"] += verdict.liar == liar
                    counts["inconclusive"] += verdict.inconclusive
                    if not verdict.use:
                        counts["rejected" if lie else "false_alarms"] += 1
                hop.record_inputs(x, [n])
                position += n
        finally:
            await hop.close()
    counts["p_identified_100_tokens"] = round(1 - (1 - counts["identified"] / counts["steps"]) ** 100, 4)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="steps per configuration (1%% lies: 3x this)")
    parser.add_argument("--std", type=float, default=0.05,
                        help="liar's noise std (0.05: ~1.3%% of a typical row after 4 layers of SmolLM2)")
    parser.add_argument("--lie-rates", type=float, nargs="+", default=[0.01, 0.1, 1.0])
    parser.add_argument("--verify", type=float, nargs="+", default=[0.05, 0.2])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.getLogger("client").setLevel(logging.ERROR)  # every caught lie logs a warning: keep the table readable
    path = prepare_demo_model()
    shard = Shard.from_pretrained(path, LAYERS.start, LAYERS.end)
    rng = random.Random(args.seed)
    rows = []
    with LocalSwarm(Path(tempfile.mkdtemp(prefix="bench-verify-")), {"OMP_NUM_THREADS": "1"}) as swarm:
        swarm.start_dht()
        common = ["--model-name", NAME, "--cache-tokens", "2048"]
        layers = f"{LAYERS.start}:{LAYERS.end}"
        honest = [swarm.start_peer(path, layers, *common, wait=False) for _ in range(2)]
        for process in honest:
            swarm.wait_online(process)
        config = ClientConfig(model_name=NAME, step_timeout=30)
        with DistributedModel.from_pretrained(path, swarm.initial_peers, config=config) as model:
            print(HEADER)
            for lie_rate in args.lie_rates:
                liar = swarm.start_peer(path, layers, *common, "--faulty", str(args.std),
                                        "--faulty-probability", str(lie_rate))
                for replicas in (1, 2):
                    model.swarm.distrusted = set() if replicas == 2 else {honest[1].peer_id}
                    for verify in args.verify:
                        steps = args.steps * (3 if lie_rate < 0.05 else 1)
                        started = time.monotonic()
                        counts = model.loop.run(run_config(model, shard, liar.peer_id, verify, steps, rng),
                                                timeout=3600)
                        row = dict(lie_rate=lie_rate, verify=verify, replicas=replicas, **counts,
                                   seconds=round(time.monotonic() - started, 1))
                        rows.append(row)
                        print_row(row)
                liar.stop()
                swarm.processes.remove(liar)
    out = Path(__file__).resolve().parent / "results" / "bench_verify_catch.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "machine": f"{platform.machine()} {platform.processor()}".strip(),
                               "std": args.std, "rows": rows}, indent=1))
    print(f"wrote {out}")


HEADER = "lie rate | verify | honest replicas | steps | lies | lies rejected | liar identified | inconclusive | false alarms | old check flags | P(identified in 100 tokens)"


def print_row(r: dict) -> None:
    lies = max(1, r["lies"])
    print(f"{r['lie_rate']:g} | {r['verify']:g} | {r['replicas']} | {r['steps']} | {r['lies']} | "
          f"{r['rejected']} ({r['rejected'] / lies:.1%}) | {r['identified']} | {r['inconclusive']} | "
          f"{r['false_alarms']} | {r['old_check'] / lies:.0%} | {r['p_identified_100_tokens']:.1%}", flush=True)


if __name__ == "__main__":
    main()
