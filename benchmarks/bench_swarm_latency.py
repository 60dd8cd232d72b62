"""Decode-step latency through 1, 2 and 3 peers on loopback, next to a bare libp2p stream round trip.

Tiny model (6 layers, hidden 64), so network, framing and session handling dominate. For each
chain length we report the median step time seen by the client, the peers' own compute time for
that step (from their `info` counters), and the overhead per hop over the bare stream round trip:
    overhead_per_hop = (step - compute) / hops - bare_rtt
Also: transfer throughput of a 2048-token prefill of SmolLM2 hidden states (576 wide, float32)
encoded and framed like a `forward` request, echoed over a libp2p stream.

    .venv/bin/python benchmarks/bench_swarm_latency.py [--steps 200] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from client import DistributedModel  # noqa: E402
from client.local_swarm import LocalSwarm  # noqa: E402
from swarm import messages as m  # noqa: E402
from swarm.codec import Limits, decode_message, encode_message, encode_tensor  # noqa: E402
from swarm.dht import SwarmNode  # noqa: E402
from swarm.framing import read_frame, write_frame  # noqa: E402

CHAINS = {1: ["0:6"], 2: ["0:3", "3:6"], 3: ["0:2", "2:4", "4:6"]}
PREFILL_TOKENS = 2048


def stream_round_trips(initial_peers: list[str], rounds: int, payload: int, gap: float = 0.0) -> tuple[float, float]:
    """Medians over a raw binary stream between two p2pd daemons: a `payload`-byte round trip, and a
    2048 x 576 float32 hidden-state tensor sent with our framing and codec and echoed back.

    `gap` seconds of idleness before each small round trip: a decode step's messages wait that long
    (the peer's compute) for their turn, and threads that went to sleep meanwhile wake slower."""

    async def run() -> float:
        server, client = (SwarmNode(initial_peers=initial_peers) for _ in range(2))
        try:
            p_srv, p_cli = await server.replicate_p2p(), await client.replicate_p2p()

            async def echo(_info, reader, writer) -> None:
                try:
                    while True:
                        await write_frame(writer, await read_frame(reader, 2**24))
                except Exception:
                    writer.close()

            await p_srv.add_binary_stream_handler("bench/echo", echo)
            from hivemind.p2p import PeerID

            _, reader, writer = await p_cli.call_binary_stream_handler(PeerID.from_base58(server.peer_id), "bench/echo")
            data, times = b"x" * payload, []
            for _ in range(rounds):
                if gap:
                    time.sleep(gap)  # blocks this loop too, as a busy peer would not answer sooner
                t = time.perf_counter()
                await write_frame(writer, data)
                await read_frame(reader, 2**24)
                times.append(time.perf_counter() - t)
            hidden, prefill = torch.randn(PREFILL_TOKENS, 576), []
            for _ in range(10):
                t = time.perf_counter()
                await write_frame(writer, encode_message({"type": m.FORWARD, "hidden": encode_tensor(hidden)}))
                decode_message(await read_frame(reader, 2**24), Limits())
                prefill.append(time.perf_counter() - t)
            writer.close()
            await p_cli.shutdown()
            await p_srv.shutdown()
            return statistics.median(times[5:]), statistics.median(prefill[2:])
        finally:
            server.shutdown()
            client.shutdown()

    return asyncio.run(run())


def peer_busy_seconds(model: DistributedModel, peer_ids: list[str]) -> float:
    return sum(model.loop.run(model.swarm.peer_info(p), timeout=40)["stats"]["busy_seconds"] for p in peer_ids)


def chain_latency(model_path: Path, initial_peers: list[str], name: str, steps: int, push: bool) -> dict:
    model = DistributedModel.from_pretrained(model_path, initial_peers, model_name=name)
    try:
        hidden = torch.randn(1, model.model_config.hidden_size)
        with model.inference_session(max_length=steps + 16, push=push) as session:
            session.step(torch.randn(8, model.model_config.hidden_size), [8])
            peers = [h.peer_id for h in session.hops]
            busy_before = peer_busy_seconds(model, peers)
            times = []
            for _ in range(steps):
                t = time.perf_counter()
                session.step(hidden, [1])
                times.append(time.perf_counter() - t)
            compute = (peer_busy_seconds(model, peers) - busy_before) / steps
        return {"hops": len(peers), "step_ms": statistics.median(times) * 1e3, "compute_ms": compute * 1e3}
    finally:
        model.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/bench_swarm_latency.json"))
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.tiny_models import build_tiny_model

    work = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    tiny = build_tiny_model(work / "tiny", "llama", num_layers=6)
    with LocalSwarm(work / "logs", {"OMP_NUM_THREADS": "1"}) as swarm:
        swarm.start_dht()
        for hops, ranges in CHAINS.items():
            for layers in ranges:
                swarm.start_peer(tiny, layers, "--model-name", f"tiny-{hops}", wait=False)
        for process in swarm.processes[1:]:
            swarm.wait_online(process)
        bare, prefill_rtt = stream_round_trips(swarm.initial_peers, 300, 64 * 4 + 64)
        rows = []
        for hops in CHAINS:
            for push in (False, True):
                if push and hops == 1:
                    continue
                r = chain_latency(tiny, swarm.initial_peers, f"tiny-{hops}", args.steps, push)
                r["mode"] = "push" if push else "relay"
                r["overhead_per_hop_ms"] = (r["step_ms"] - r["compute_ms"]) / hops - bare * 1e3
                rows.append(r)
        megabytes = 2 * PREFILL_TOKENS * 576 * 4 / 1e6  # there and back
        prefill = {"tokens": PREFILL_TOKENS, "megabytes": megabytes, "round_trip_ms": prefill_rtt * 1e3,
                   "MBps": megabytes / prefill_rtt}
    print(f"bare libp2p stream round trip (320 B): {bare * 1e3:.3f} ms")
    print(f"{'hops':>4} {'mode':>6} {'step ms':>8} {'compute ms':>10} {'overhead/hop ms':>15}")
    for r in rows:
        print(f"{r['hops']:>4} {r['mode']:>6} {r['step_ms']:>8.2f} {r['compute_ms']:>10.2f} {r['overhead_per_hop_ms']:>15.2f}")
    print(f"prefill {prefill['tokens']} tokens x 576 float32 ({prefill['megabytes']:.1f} MB there and back, "
          f"framed + encoded): {prefill['round_trip_ms']:.1f} ms, {prefill['MBps']:.0f} MB/s")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "bare_rtt_ms": bare * 1e3,
                                     "chains": rows, "prefill": prefill}, indent=2))


if __name__ == "__main__":
    main()
