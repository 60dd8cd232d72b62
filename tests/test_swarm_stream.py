"""PeerStream over real libp2p binary streams between two DHT nodes' P2P replicas."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import torch

from swarm.codec import Limits, decode_tensor, encode_message, encode_tensor
from swarm.connection import PeerStream, open_stream, serve_stream, stream_handler
from swarm.errors import ConnectionClosed, ProtocolError, RemoteError
from swarm.framing import write_frame
from swarm.messages import PROTOCOL_NAME, require_tensor, require_type

LIMITS = Limits(max_frame_bytes=64 * 2**20, max_tensor_elements=16 * 2**20)


async def echo(stream: PeerStream) -> None:
    """A handler in the style a peer will use: validate, answer, and never die on bad input."""
    async for msg in serve_stream(stream):
        try:
            kind = require_type(msg, frozenset({"echo", "boom"}))
            if kind == "boom":
                raise RuntimeError("handler bug")
            hidden = require_tensor(msg, "hidden", stream.limits, ndim=2)
            await stream.send({"type": "result", "hidden": encode_tensor(hidden * 2), "n": msg.get("n")})
        except Exception as e:  # noqa: BLE001 - a peer answers every failure with an error frame
            err = e if isinstance(e, ProtocolError) else ProtocolError("internal", str(e), retryable=True)
            await stream.send_error(err)


@pytest.fixture
async def p2p_pair(swarm_node_factory) -> AsyncIterator[tuple]:
    server = swarm_node_factory()
    client = swarm_node_factory(initial_peers=server.visible_maddrs(), client_mode=True)
    server_p2p = await server.replicate_p2p()
    client_p2p = await client.replicate_p2p()
    await server_p2p.add_binary_stream_handler(PROTOCOL_NAME, stream_handler(echo, LIMITS))
    try:
        yield server, client_p2p
    finally:
        await client_p2p.shutdown()
        await server_p2p.shutdown()


async def test_large_tensor_round_trip(p2p_pair) -> None:
    server, client_p2p = p2p_pair
    stream = await open_stream(client_p2p, server.peer_id, LIMITS)
    for rows in (1, 2048):  # 2048 x 576 float32 = 4.5 MiB, above the 4 MiB unary limit
        hidden = torch.randn(rows, 576)
        reply = await stream.request({"type": "echo", "hidden": encode_tensor(hidden), "n": rows}, timeout=30)
        assert reply["type"] == "result" and reply["n"] == rows
        assert torch.equal(decode_tensor(reply["hidden"], LIMITS), hidden * 2)
    await stream.close()


async def test_bad_frames_get_error_frames_and_serving_continues(p2p_pair) -> None:
    server, client_p2p = p2p_pair
    stream = await open_stream(client_p2p, server.peer_id, LIMITS)
    await write_frame(stream.writer, b"\xc1 not msgpack")
    with pytest.raises(RemoteError) as info:
        await stream.recv(timeout=10)
    assert info.value.code == "bad_message" and info.value.peer_id == server.peer_id

    bad_tensor = {"type": "echo", "hidden": {"dtype": "float64", "shape": [1], "data": b"\0" * 8}}
    for msg, code in [
        ({"type": "nope"}, "unknown_type"),
        (bad_tensor, "bad_tensor"),
        ({"type": "boom"}, "internal"),
    ]:
        with pytest.raises(RemoteError) as info:
            await stream.request(msg, timeout=10)
        assert info.value.code == code

    ok = await stream.request({"type": "echo", "hidden": encode_tensor(torch.ones(1, 3))}, timeout=10)
    assert torch.equal(decode_tensor(ok["hidden"], LIMITS), torch.full((1, 3), 2.0))
    await stream.close()


async def test_oversized_frame_answered_then_stream_closed(p2p_pair) -> None:
    server, client_p2p = p2p_pair
    stream = await open_stream(client_p2p, server.peer_id, Limits())
    stream.writer.write(
        (LIMITS.max_frame_bytes + 1).to_bytes(4, "big")
    )  # header only: never send the payload
    await stream.writer.drain()
    with pytest.raises(RemoteError) as info:
        await stream.recv(timeout=10)
    assert info.value.code == "too_large"
    with pytest.raises(ConnectionClosed):
        await stream.recv(timeout=10)
    # the handler is still registered: a new stream works
    again = await open_stream(client_p2p, server.peer_id, LIMITS)
    reply = await again.request({"type": "echo", "hidden": encode_tensor(torch.zeros(2, 2))}, timeout=10)
    assert reply["type"] == "result"
    await again.close()


async def test_concurrent_streams_and_timeout(p2p_pair) -> None:
    server, client_p2p = p2p_pair

    async def one(i: int) -> float:
        stream = await open_stream(client_p2p, server.peer_id, LIMITS)
        reply = await stream.request(
            {"type": "echo", "hidden": encode_tensor(torch.full((1, 4), float(i)))}, timeout=10
        )
        await stream.close()
        return float(decode_tensor(reply["hidden"], LIMITS)[0, 0])

    assert await asyncio.gather(*(one(i) for i in range(8))) == [2.0 * i for i in range(8)]

    stream = await open_stream(client_p2p, server.peer_id, LIMITS)
    with pytest.raises(asyncio.TimeoutError):
        await stream.recv(timeout=0.2)  # nothing was asked
    assert stream.closed  # a read cancelled mid-wait may have desynchronised the stream
    with pytest.raises(ConnectionClosed):
        await stream.send({"type": "echo"})
    await stream.close()


async def test_encode_message_payload_matches_framing() -> None:
    # a frame built by hand with encode_message decodes through PeerStream on an in-memory reader
    reader = asyncio.StreamReader()
    payload = encode_message({"type": "result", "x": 1})
    reader.feed_data(len(payload).to_bytes(4, "big") + payload)
    reader.feed_eof()
    stream = PeerStream(reader, writer=None, limits=LIMITS)  # type: ignore[arg-type]
    assert await stream.recv() == {"type": "result", "x": 1}
    with pytest.raises(ConnectionClosed) as info:
        await stream.recv()
    assert info.value.clean
