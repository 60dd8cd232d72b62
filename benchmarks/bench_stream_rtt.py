"""Round-trip time on loopback: bare libp2p binary stream vs our framing + msgpack codec.

Starts two SwarmNodes on 127.0.0.1, echoes payloads over one long-lived stream, and reports the
median of N round trips per case. Prints a table and writes benchmarks/results/stream_rtt.json.
Usage: .venv/bin/python benchmarks/bench_stream_rtt.py [--n 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swarm.codec import Limits, decode_tensor, encode_tensor  # noqa: E402
from swarm.connection import PeerStream, open_stream, serve_stream, stream_handler  # noqa: E402
from swarm.dht import SwarmNode  # noqa: E402
from swarm.messages import PROTOCOL_NAME, require_tensor  # noqa: E402

BARE = "layerswarm/bench-bare"
LIMITS = Limits()


async def bare_echo(_info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Echo raw chunks: a 4-byte size, then the bytes (no msgpack, no tensor codec, no PeerStream)."""
    try:
        while True:
            size = int.from_bytes(await reader.readexactly(4), "big")
            writer.write(await reader.readexactly(size))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
        writer.close()


async def codec_echo(stream: PeerStream) -> None:
    async for msg in serve_stream(stream):
        if "hidden" in msg:
            hidden = require_tensor(msg, "hidden", stream.limits)
            await stream.send({"type": "result", "hidden": encode_tensor(hidden)})
        else:
            await stream.send({"type": "result", "data": msg["data"]})


async def timed(n: int, fn) -> float:
    for _ in range(10):  # warm-up
        await fn()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


async def run(n: int) -> list[dict]:
    server = SwarmNode()
    client = SwarmNode(initial_peers=server.visible_maddrs(), client_mode=True)
    rows: list[dict] = []
    try:
        server_p2p, client_p2p = await server.replicate_p2p(), await client.replicate_p2p()
        await server_p2p.add_binary_stream_handler(BARE, bare_echo)
        await server_p2p.add_binary_stream_handler(PROTOCOL_NAME, stream_handler(codec_echo, LIMITS))
        from hivemind.p2p import PeerID

        _, reader, writer = await client_p2p.call_binary_stream_handler(
            PeerID.from_base58(server.peer_id), BARE
        )
        stream = await open_stream(client_p2p, server.peer_id, LIMITS)
        cases = [
            ("64 B", b"x" * 64, None),
            ("576 x f32", None, torch.randn(1, 576)),
            ("2048 x 576 x f32 (4.5 MiB)", None, torch.randn(2048, 576)),
        ]
        for name, raw, tensor in cases:
            blob = raw if raw is not None else tensor.numpy().tobytes()

            async def bare(blob: bytes = blob) -> None:
                writer.write(len(blob).to_bytes(4, "big"))
                writer.write(blob)
                await writer.drain()
                await reader.readexactly(len(blob))

            async def ours(raw: bytes | None = raw, tensor: torch.Tensor | None = tensor) -> None:
                if tensor is None:
                    await stream.request({"type": "echo", "data": raw})
                else:
                    reply = await stream.request({"type": "echo", "hidden": encode_tensor(tensor)})
                    decode_tensor(reply["hidden"], LIMITS)

            reps = n if len(blob) < 1 << 20 else max(20, n // 10)
            bare_s, ours_s = await timed(reps, bare), await timed(reps, ours)
            rows.append(
                {
                    "case": name,
                    "bytes": len(blob),
                    "n": reps,
                    "bare_ms": bare_s * 1e3,
                    "codec_ms": ours_s * 1e3,
                    "overhead_ms": (ours_s - bare_s) * 1e3,
                }
            )
        writer.close()
        await stream.close()
        await client_p2p.shutdown()
        await server_p2p.shutdown()
    finally:
        client.shutdown()
        server.shutdown()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="round trips per case (median reported)")
    args = parser.parse_args()
    rows = asyncio.run(run(args.n))
    print(f"{'case':<28} {'bytes':>9} {'n':>4} {'bare ms':>9} {'ours ms':>9} {'overhead':>9}")
    for r in rows:
        print(
            f"{r['case']:<28} {r['bytes']:>9} {r['n']:>4} {r['bare_ms']:>9.3f} {r['codec_ms']:>9.3f} {r['overhead_ms']:>9.3f}"
        )
    out = Path(__file__).parent / "results" / "stream_rtt.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "time": time.time(),
    }
    out.write_text(json.dumps({"benchmark": "stream_rtt", "meta": meta, "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
