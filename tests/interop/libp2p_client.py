"""A layerswarm client on py-libp2p: dial one peer, learn the swarm from it, generate greedily.

Runs in its own virtual environment (tests/interop/requirements.txt), never in a process that
imports hivemind (both register the protobuf package `crypto.pb`), and imports nothing of
layerswarm: it follows docs/protocol.md ("Talking to peers from another libp2p implementation").

    python tests/interop/libp2p_client.py --peer /ip4/127.0.0.1/tcp/PORT/p2p/PEER_ID \
        --model-dir CHECKPOINT --prompt-ids 1,2,3 --decode-steps 16

Steps: connect (Noise + yamux) -> `info` -> `view` -> check every record's owner signature
(signed_records.py; bad ones are dropped) -> plan a route covering [0, num_layers) from the
verified records only -> connect to the route's other peers from their records' addresses -> `open` a session on each hop
-> prefill and `--decode-steps` greedy steps, relaying each hop's output to the next itself ->
`close`. Prints one JSON object on stdout: what was negotiated, seen and generated.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import multiaddr
import numpy as np
import trio
from head import ClientHead
from libp2p import create_mplex_muxer_option, create_yamux_muxer_option, new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.security.tls.transport import PROTOCOL_ID as TLS_ID
from libp2p.security.tls.transport import TLSTransport
from signed_records import verify_view
from wire import MessageStream, decode_tensor, encode_tensor

PROTOCOL = TProtocol("layerswarm/v1")  # the stream protocol id, as is (no leading slash)


def security_options(name: str, key_pair: Any) -> dict:
    if name == "noise":
        return {NOISE_ID: NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)}
    return {TLS_ID: TLSTransport(key_pair)}


def valid_layers(layers: Any) -> bool:
    """A signed record is its owner's word, not necessarily sane: [a, b) must be two ints with 0 <= a < b."""
    return (isinstance(layers, list) and len(layers) == 2 and all(type(x) is int for x in layers)
            and 0 <= layers[0] < layers[1])


def plan_route(records: list[dict[str, Any]], num_layers: int) -> list[tuple[dict[str, Any], int, int]]:
    """Hops (record, start, end) covering [0, num_layers), from each position the online peer reaching
    furthest (a real client weighs throughput and latency: see routing/ in layerswarm); [] if none covers."""
    online = [r for r in records if r.get("state") == "online" and valid_layers(r.get("layers"))]
    route, position = [], 0
    while position < num_layers:
        covering = [r for r in online if r["layers"][0] <= position < r["layers"][1]]
        if not covering:
            return []
        best = max(covering, key=lambda r: (r["layers"][1], r.get("throughput", 0)))
        end = min(best["layers"][1], num_layers)
        route.append((best, position, end))
        position = end
    return route


def peer_info_of(record: dict[str, Any]) -> PeerInfo:
    """Dialable TCP addresses of a record (p2pd also listens on QUIC, which this client does not dial)."""
    addrs = []
    for text in record.get("addrs", []):
        addr = multiaddr.Multiaddr(text if "/p2p/" in text else f"{text}/p2p/{record['peer_id']}")
        if "/tcp/" in text:
            addrs.extend(info_from_p2p_addr(addr).addrs)
    if not addrs:
        raise SystemExit(f"peer {record['peer_id']} announces no TCP address: {record.get('addrs')}")
    return PeerInfo(ID.from_base58(record["peer_id"]), addrs)


async def generate(args: argparse.Namespace) -> dict[str, Any]:
    key_pair = create_new_key_pair()
    muxer = create_yamux_muxer_option() if args.muxer == "yamux" else create_mplex_muxer_option()
    host = new_host(key_pair=key_pair, sec_opt=security_options(args.security, key_pair), muxer_opt=muxer)
    head = ClientHead(Path(args.model_dir))
    prompt = [int(t) for t in args.prompt_ids.split(",")]
    out: dict[str, Any] = {"security": args.security, "muxer": args.muxer}
    async with host.run(listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        first = info_from_p2p_addr(multiaddr.Multiaddr(args.peer))
        with trio.fail_after(args.timeout):
            await host.connect(first)
        entry = MessageStream(await host.new_stream(first.peer_id, [PROTOCOL]), args.timeout)

        info = await entry.request({"type": "info"}, expect="info")
        model, num_layers, dtype = info["record"]["model"], info["record"]["num_layers"], info["record"]["dtype"]
        attempts = max(1, args.view_attempts)
        for attempt in range(attempts):  # a peer that just joined may not be in the DHT yet
            view = await entry.request({"type": "view", "model": model}, expect="view")
            records, rejected = verify_view(view, model)  # the peer relays; only the owners' signatures count
            route = plan_route(records, num_layers)
            if route or attempt + 1 == attempts:
                break
            await trio.sleep(1.0)
        out.update(info=info["record"], view={"num_layers": view["num_layers"], "truncated": view["truncated"],
                                              "records": records, "rejected": rejected})
        await entry.close()
        if not route:
            raise SystemExit(f"the verified records do not cover layers [0, {num_layers}): {records} "
                             f"(rejected: {rejected})")
        out["route"] = [[r["peer_id"], a, b] for r, a, b in route]
        streams = []
        for record, start, end in route:
            peer = peer_info_of(record)
            with trio.fail_after(args.timeout):
                await host.connect(peer)
            stream = MessageStream(await host.new_stream(peer.peer_id, [PROTOCOL]), args.timeout)
            await stream.request({"type": "open", "session_id": secrets.token_hex(16), "batch": 1,
                                  "max_length": len(prompt) + args.decode_steps + 1,
                                  "layers": [start, end]}, expect="opened")
            streams.append(stream)

        tokens: list[int] = []
        new_ids, position, step_seconds = prompt, 0, []
        for step_id in range(args.decode_steps + 1):  # step 0 is the prefill
            started = time.perf_counter()
            hidden = head.embed_tokens(new_ids)  # (N, H)
            for stream in streams:  # relay: each hop's output is the next hop's input
                result = await stream.request(
                    {"type": "step", "step_id": step_id, "hidden": encode_tensor(hidden, dtype),
                     "new_tokens": [len(new_ids)], "positions": [position]}, expect="result")
                if result["step_id"] != step_id:
                    raise SystemExit(f"reply for step {result['step_id']}, expected {step_id}")
                hidden = decode_tensor(result["hidden"])
                if hidden.shape != (len(new_ids), head.embed.shape[1]):
                    raise SystemExit(f"hop returned shape {hidden.shape}")
            token = int(np.argmax(head.logits(hidden[-1:])[0]))
            tokens.append(token)
            step_seconds.append(time.perf_counter() - started)
            position += len(new_ids)
            new_ids = [token]
        for stream in streams:
            await stream.request({"type": "close"}, expect="closed")
            await stream.close()
        out.update(tokens=tokens, prefill_seconds=step_seconds[0],
                   decode_ms_per_token=1000 * sum(step_seconds[1:]) / max(1, len(step_seconds) - 1))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peer", required=True, help="multiaddr of one peer, ending in /p2p/PEER_ID")
    parser.add_argument("--model-dir", required=True, help="checkpoint folder (config.json + safetensors) "
                        "for the client's embeddings, final norm and LM head")
    parser.add_argument("--prompt-ids", required=True, help="comma-separated prompt token ids")
    parser.add_argument("--decode-steps", type=int, default=16, help="greedy steps after the prefill")
    parser.add_argument("--security", choices=["noise", "tls"], default="noise",
                        help="channel security to offer (our peers' p2pd accepts both)")
    parser.add_argument("--muxer", choices=["yamux", "mplex"], default="yamux",
                        help="stream multiplexer to offer (our peers' p2pd accepts both)")
    parser.add_argument("--view-attempts", type=int, default=10,
                        help="ask `view` up to this many times (1 s apart) until the peers seen cover every layer")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds allowed for each connection and each request's reply")
    args = parser.parse_args()
    print(json.dumps(trio.run(generate, args)), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
