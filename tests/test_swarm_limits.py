"""Memory bounded before validation, through real libp2p streams on 127.0.0.1.

Before (2026-11-30): an 8 MiB frame of empty msgpack maps grew a peer by 587 MiB (also from a
stranger, before the private swarm's auth refused it); partial frames held open on 4 streams
pinned 600 MiB with no timeout; a dim >= 2^63 beside a zero dim, or a dtype nested 1,000 deep,
raised TypeError / RecursionError inside the peer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgpack
import psutil
import pytest
import torch

from swarm.auth import SwarmKey
from swarm.codec import Limits, encode_tensor
from swarm.connection import PeerStream, open_stream, require_auth, serve_stream, stream_handler
from swarm.dht import SwarmNode
from swarm.errors import ConnectionClosed, RemoteError
from swarm.framing import HEADER, write_frame
from swarm.messages import PROTOCOL_NAME

LIMITS = Limits(max_frame_bytes=16 * 2**20, max_tensor_elements=2**20, frame_timeout=1.0,
                min_bytes_per_second=2**40, max_streams_per_peer=3)


def empty_maps_frame(size: int = 8 * 2**20) -> bytes:
    """A message whose field `x` is lists of empty maps (one byte each), `size` bytes in all.

    Each list stays under max_array_len, so only the message-wide container budget stops it.
    """
    head = b"\x82" + msgpack.packb("type") + msgpack.packb("info") + msgpack.packb("x")
    per_list = 2**19
    lists = (size - len(head)) // (per_list + 5)
    body = (b"\xdd" + per_list.to_bytes(4, "big") + b"\x80" * per_list) * lists
    return head + b"\xdd" + lists.to_bytes(4, "big") + body


def nested(depth: int) -> object:
    value: object = "float32"
    for _ in range(depth):
        value = [value]
    return value


async def serve_echo(stream: PeerStream) -> None:
    async for msg in serve_stream(stream):
        await stream.send({"type": "result", "n": msg.get("n")})


@pytest.fixture
async def pair(swarm_node_factory, tmp_path) -> AsyncIterator[tuple]:
    server = swarm_node_factory()
    client = swarm_node_factory(initial_peers=server.visible_maddrs(), client_mode=True)
    server_p2p = await server.replicate_p2p()
    client_p2p = await client.replicate_p2p()
    SwarmKey.generate(tmp_path / "swarm.key")
    key = SwarmKey.load(tmp_path / "swarm.key")
    own_id = server.peer_id

    async def private(stream: PeerStream) -> None:
        if await require_auth(stream, key, own_id):
            await serve_echo(stream)

    await server_p2p.add_binary_stream_handler(PROTOCOL_NAME, stream_handler(serve_echo, LIMITS))
    await server_p2p.add_binary_stream_handler("private", stream_handler(private, LIMITS))
    try:
        yield server, client_p2p
    finally:
        await client_p2p.shutdown()
        await server_p2p.shutdown()


async def test_decoder_edge_cases_are_clean_errors(pair) -> None:
    server, client_p2p = pair
    stream = await open_stream(client_p2p, server.peer_id, LIMITS)
    cases = [
        (empty_maps_frame(), "too_large"),  # container budget, not 587 MiB of dicts
        (msgpack.packb({"type": "step", "hidden": {"dtype": nested(1000), "shape": [1], "data": b""}}), "bad_message"),
        (msgpack.packb({"type": "x", "a": [[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]}), "bad_message"),
        (msgpack.packb({"type": "x", "s": "y" * (2**16 + 1)}), "bad_message"),
    ]
    for payload, code in cases:
        await write_frame(stream.writer, payload)
        with pytest.raises(RemoteError) as info:
            await stream.recv(timeout=30)
        assert info.value.code == code, info.value
    assert (await stream.request({"type": "echo", "n": 1}, timeout=10))["n"] == 1  # the stream still serves
    await stream.close()


async def test_stalled_frame_times_out_and_frees_the_stream(pair) -> None:
    server, client_p2p = pair
    stream = await open_stream(client_p2p, server.peer_id, LIMITS)
    stream.writer.write(HEADER.pack(4 * 2**20) + b"\0" * 1024)  # 4 MiB announced, 1 KiB sent
    await stream.writer.drain()
    started = time.monotonic()
    with pytest.raises(RemoteError) as info:
        await stream.recv(timeout=20)
    assert info.value.code == "timeout"
    assert time.monotonic() - started < 10
    with pytest.raises(ConnectionClosed):  # a stream stopped mid-frame cannot be resynchronised
        await stream.recv(timeout=10)
    await stream.close()


async def test_streams_per_peer_are_capped(pair) -> None:
    server, client_p2p = pair
    streams = [await open_stream(client_p2p, server.peer_id, LIMITS) for _ in range(LIMITS.max_streams_per_peer)]
    for i, stream in enumerate(streams):
        assert (await stream.request({"type": "echo", "n": i}, timeout=10))["n"] == i
    extra = await open_stream(client_p2p, server.peer_id, LIMITS)
    with pytest.raises(RemoteError) as info:
        await extra.request({"type": "echo", "n": 99}, timeout=10)
    assert info.value.code == "limit"
    await extra.close()
    await streams[0].close()
    await asyncio.sleep(0.5)  # the server notices the closed stream
    again = await open_stream(client_p2p, server.peer_id, LIMITS)
    assert (await again.request({"type": "echo", "n": 7}, timeout=10))["n"] == 7
    for stream in [again, *streams[1:]]:
        await stream.close()


async def test_stranger_costs_a_few_kib_before_auth(pair) -> None:
    server, client_p2p = pair
    stream = await open_stream(client_p2p, server.peer_id, LIMITS, name="private")
    started = time.monotonic()
    with pytest.raises((ConnectionClosed, RemoteError, ConnectionError)):  # refused while writing, or after
        await write_frame(stream.writer, empty_maps_frame(2**20))  # above the 4 KiB first-frame limit
        await stream.recv(timeout=10)
    assert time.monotonic() - started < 5
    await stream.close()


@pytest.mark.slow
def test_empty_maps_frame_does_not_grow_a_real_peer(tiny_model: Path, local_swarm) -> None:
    """RSS of a `swarm-peer serve` process before/after five 8 MiB frames of empty maps."""
    peer = local_swarm.start_peer(tiny_model, "0:4")
    proc = psutil.Process(peer.pid)

    async def attack() -> tuple[list[str], int, int]:
        node = SwarmNode(initial_peers=peer.maddrs, client_mode=True)
        p2p = await node.replicate_p2p()
        try:
            stream = await open_stream(p2p, peer.peer_id, Limits())
            await stream.request({"type": "info"}, timeout=30)
            before = proc.memory_info().rss
            codes = []
            for _ in range(5):
                await write_frame(stream.writer, empty_maps_frame())
                try:
                    await stream.recv(timeout=60)
                except RemoteError as e:
                    codes.append(e.code)
            after = proc.memory_info().rss
            ok = await stream.request({"type": "forward", "hidden": encode_tensor(torch.randn(2, 64)),
                                       "new_tokens": [2]}, timeout=30)
            assert ok["type"] == "result"
            await stream.close()
            return codes, before, after
        finally:
            await p2p.shutdown()
            node.shutdown()

    codes, before, after = asyncio.run(attack())
    growth = (after - before) / 2**20
    print(f"peer RSS {before / 2**20:.0f} MiB -> {after / 2**20:.0f} MiB after 5 frames of 8 MiB empty maps")
    assert codes == ["too_large"] * 5
    assert growth < 48, f"peer grew by {growth:.0f} MiB (was 587 MiB per frame before the container limits)"
