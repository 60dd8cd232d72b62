"""Real `swarm-peer` processes driven by a raw stream client: records, sessions, bad input, limits."""

from __future__ import annotations

import asyncio
import math
import signal
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from client.local_swarm import LocalSwarm
from shards.batch import BatchLayout
from shards.shard import Shard
from swarm import messages as m
from swarm.codec import Limits, encode_tensor
from swarm.connection import PeerStream, open_stream
from swarm.dht import SwarmNode
from swarm.errors import ConnectionClosed, RemoteError
from swarm.types import PeerState
from tests.swarm_processes import new_test_swarm

pytestmark = pytest.mark.slow
HIDDEN = 64  # tests/tiny_models.py


@pytest.fixture(scope="module")
def two_peers(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSwarm]:
    swarm = new_test_swarm(tmp_path_factory.mktemp("two-peers"))
    try:
        swarm.start_dht()
        # Small cache (8 pages of 4 tokens) so the pool-exhaustion case is cheap to reach; no per-client
        # quota, since that case fills the pool from one client.
        peers = [swarm.start_peer(tiny_model, "0:2", "--cache-tokens", "32", "--page-size", "4", "--alloc-timeout",
                                  "0.5", "--max-length", "64", "--max-client-pages-fraction", "1", wait=False),
                 swarm.start_peer(tiny_model, "2:4", wait=False)]  # both load at once
        for peer in peers:
            swarm.wait_online(peer)
        yield swarm
    finally:
        swarm.close()


@pytest.fixture
def client_node(two_peers: LocalSwarm) -> Iterator[SwarmNode]:
    node = SwarmNode(initial_peers=two_peers.initial_peers, client_mode=True)
    try:
        yield node
    finally:
        node.shutdown()


def model_name(path: Path) -> str:
    return path.resolve().name


async def fetch_until(node: SwarmNode, model: str, predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        view = await node.fetch_view_async(model)
        if predicate(view) or time.monotonic() > deadline:
            return view
        await asyncio.sleep(0.5)


async def info(p2p, peer_id: str) -> dict:
    stream = await open_stream(p2p, peer_id, Limits())
    try:
        return await stream.request({"type": m.INFO}, timeout=10)
    finally:
        await stream.close()


async def open_session(p2p, peer_id: str, max_length: int = 64, layers: list[int] | None = None) -> PeerStream:
    stream = await open_stream(p2p, peer_id, Limits())
    msg = {"type": m.OPEN, "max_length": max_length, "batch": 1}
    if layers:
        msg["layers"] = layers
    reply = await stream.request(msg, timeout=10)
    assert reply["type"] == m.OPENED
    return stream


async def step(stream: PeerStream, hidden: torch.Tensor, position: int, step_id: int) -> torch.Tensor:
    reply = await stream.request(
        {"type": m.STEP, "step_id": step_id, "hidden": encode_tensor(hidden),
         "new_tokens": [hidden.shape[0]], "positions": [position]},
        timeout=30,
    )
    return m.require_tensor(reply, "hidden", Limits(), ndim=2)


async def test_records_visible_and_correct(two_peers: LocalSwarm, client_node: SwarmNode, tiny_model: Path) -> None:
    view = await fetch_until(client_node, model_name(tiny_model), lambda v: len(v.online()) == 2)
    by_layers = {str(r.layers): r for r in view.online()}
    assert set(by_layers) == {"0:2", "2:4"}
    first = by_layers["0:2"]
    assert first.peer_id == two_peers.processes[1].peer_id
    assert first.num_layers == 4 and first.dtype == "float32" and first.throughput > 0
    assert first.total_pages == 8 and first.page_size == 4 and first.free_pages == 8
    assert first.fingerprint and first.fingerprint != by_layers["2:4"].fingerprint
    assert any(a.endswith(first.peer_id) for a in first.addrs)
    assert view.uncovered_layers() == []


async def test_prefill_and_decode_through_two_peers_match_local_shards(
    two_peers: LocalSwarm, client_node: SwarmNode, tiny_model: Path
) -> None:
    p2p = await client_node.replicate_p2p()
    try:
        peer_a, peer_b = two_peers.processes[1].peer_id, two_peers.processes[2].peer_id
        a, b = await open_session(p2p, peer_a), await open_session(p2p, peer_b)
        local = [Shard.from_pretrained(tiny_model, 0, 2), Shard.from_pretrained(tiny_model, 2, 4)]
        caches = [s.new_cache(8, 16) for s in local]
        torch.manual_seed(0)
        inputs = [torch.randn(10, HIDDEN)] + [torch.randn(1, HIDDEN) for _ in range(20)]
        position = 0
        for i, x in enumerate(inputs):
            remote = await step(b, await step(a, x, position, i), position, i)
            layout = BatchLayout([x.shape[0]], [position], [list(range(8))], 16)
            expected = local[1].forward(local[0].forward(x, layout, caches[0]), layout, caches[1])
            assert torch.allclose(remote, expected, atol=1e-5), f"step {i}: {(remote - expected).abs().max()}"
            position += x.shape[0]
        await a.close()
        await b.close()
    finally:
        await p2p.shutdown()


async def expect_error(stream: PeerStream, msg: dict, code: str) -> RemoteError:
    with pytest.raises(RemoteError) as caught:
        await stream.request(msg, timeout=10)
    assert caught.value.code == code, caught.value
    return caught.value


async def test_bad_input_gets_error_frames_and_peer_keeps_serving(
    two_peers: LocalSwarm, client_node: SwarmNode
) -> None:
    peer = two_peers.processes[1].peer_id
    p2p = await client_node.replicate_p2p()
    try:
        before = (await info(p2p, peer))["record"]["free_pages"]
        # Garbage bytes in a well-formed frame: answered, the stream stays usable.
        raw = await open_stream(p2p, peer, Limits())
        raw.writer.write(struct.pack(">I", 5) + b"\xc1\xff\x00ab")
        await raw.writer.drain()
        with pytest.raises(RemoteError) as caught:
            await raw.recv(timeout=10)
        assert caught.value.code == "bad_message"
        assert (await raw.request({"type": m.INFO}, timeout=10))["type"] == m.INFO
        # A frame declaring 10 GB: refused before anything is read, then the stream ends.
        raw.writer.write(struct.pack(">I", 2**32 - 1))
        await raw.writer.drain()
        with pytest.raises(RemoteError) as caught:
            await raw.recv(timeout=10)
        assert caught.value.code == "too_large"
        with pytest.raises(ConnectionClosed):
            await raw.recv(timeout=10)
        # A frame cut short: the peer drops that stream only.
        cut = await open_stream(p2p, peer, Limits())
        cut.writer.write(struct.pack(">I", 100) + b"abc")
        await cut.writer.drain()
        await cut.close()
        unknown = await open_stream(p2p, peer, Limits())
        await expect_error(unknown, {"type": "teleport"}, "unknown_type")
        # A crash notice is noted whatever the peer makes of it (here a fixed peer: nothing to rebalance);
        # a malformed one is a bad_field, and the stream goes on.
        assert (await unknown.request({"type": m.CRASH_NOTICE, "peer_id": "Qm-nobody", "announced": 1.0},
                                      timeout=10))["type"] == m.NOTED
        await expect_error(unknown, {"type": m.CRASH_NOTICE, "peer_id": "Qm-nobody", "announced": "soon"}, "bad_field")
        await expect_error(unknown, {"type": m.STEP, "step_id": 0, "hidden": encode_tensor(torch.zeros(1, HIDDEN)),
                                     "new_tokens": [1], "positions": [0]}, "no_session")
        await unknown.close()

        session = await open_session(p2p, peer, max_length=12)
        ok = torch.randn(4, HIDDEN)
        cases = [
            (torch.randn(4, HIDDEN + 1), [4], [0], "bad_tensor"),  # wrong hidden size
            (ok.to(torch.float16), [4], [0], "bad_tensor"),  # wrong dtype
            (torch.full((4, HIDDEN), math.nan), [4], [0], "bad_tensor"),  # NaN
            (ok, [4], [3], "out_of_order"),  # positions out of order
            (ok, [3], [0], "bad_field"),  # rows != new_tokens
            (torch.randn(13, HIDDEN), [13], [0], "too_long"),  # longer than max_length
        ]
        for i, (hidden, new_tokens, positions, code) in enumerate(cases):
            await expect_error(session, {"type": m.STEP, "step_id": i, "hidden": encode_tensor(hidden),
                                         "new_tokens": new_tokens, "positions": positions}, code)
        # After all of that, the session still works from position 0.
        assert (await step(session, ok, 0, 99)).shape == (4, HIDDEN)
        await session.close()

        # More sessions than pages: 8 pages of 4 tokens; each session takes 3 pages for 12 tokens.
        holders = [await open_session(p2p, peer, max_length=12) for _ in range(3)]
        for i, holder in enumerate(holders[:2]):
            await step(holder, torch.randn(12, HIDDEN), 0, i)
        error = await expect_error(holders[2], {"type": m.STEP, "step_id": 0, "hidden": encode_tensor(torch.randn(12, HIDDEN)),
                                                "new_tokens": [12], "positions": [0]}, "busy")
        assert error.retryable
        await holders[0].close()  # freeing one admits the waiter
        assert (await step(holders[2], torch.randn(12, HIDDEN), 0, 1)).shape == (12, HIDDEN)
        for holder in holders[1:]:
            await holder.close()
        after = await fetch_free_pages(p2p, peer, before)
        assert after == before, "pages leaked"
    finally:
        await p2p.shutdown()


async def fetch_free_pages(p2p, peer: str, expected: int, timeout: float = 10.0) -> int:
    """Closing is asynchronous on the peer: poll until the pool is back (or time is up)."""
    deadline = time.monotonic() + timeout
    while True:
        free = (await info(p2p, peer))["record"]["free_pages"]
        if free == expected or time.monotonic() > deadline:
            return free
        await asyncio.sleep(0.1)


async def test_fifty_sessions_leave_the_pool_as_it_was(two_peers: LocalSwarm, client_node: SwarmNode) -> None:
    peer = two_peers.processes[2].peer_id
    p2p = await client_node.replicate_p2p()
    try:
        before = (await info(p2p, peer))["record"]["free_pages"]
        for i in range(50):
            stream = await open_session(p2p, peer)
            await step(stream, torch.randn(3 + i % 20, HIDDEN), 0, 0)
            if i % 2:
                await stream.request({"type": m.CLOSE}, timeout=10)
            await stream.close()  # even ones: the stream just goes away
        assert await fetch_free_pages(p2p, peer, before) == before
        stats = (await info(p2p, peer))["stats"]
        assert stats["sessions"] == 0
    finally:
        await p2p.shutdown()


async def test_kill9_record_vanishes_and_clean_stop_announces_offline(two_peers: LocalSwarm, tiny_model: Path) -> None:
    """On the module's DHT, under a model name of its own (the two peers above do not show up)."""
    swarm, name = two_peers, "kill9-record-vanishes"
    started = []
    node = None
    try:
        started = [swarm.start_peer(tiny_model, "0:4", "--announce-ttl", ttl, "--model-name", name, wait=False)
                   for ttl in ("3", "60")]
        doomed, polite = started
        for peer in started:
            swarm.wait_online(peer)
        node = SwarmNode(initial_peers=swarm.initial_peers, client_mode=True)
        view = await fetch_until(node, name, lambda v: len(v.online()) == 2)
        assert {r.peer_id for r in view.online()} == {doomed.peer_id, polite.peer_id}
        doomed.kill()
        view = await fetch_until(node, name, lambda v: doomed.peer_id not in v.records, timeout=20)
        assert doomed.peer_id not in view.records
        assert polite.stop() == 0
        view = await fetch_until(node, name, lambda v: not v.online(), timeout=10)
        assert view.records[polite.peer_id].state is PeerState.OFFLINE
    finally:
        if node is not None:
            node.shutdown()
        for peer in started:
            peer.kill()


def test_sigterm_exits_zero_quickly(tiny_model: Path, local_swarm: LocalSwarm) -> None:
    peer = local_swarm.start_peer(tiny_model, "0:4")
    assert peer.maddrs, "a peer without --initial-peers prints its multiaddrs"
    started = time.monotonic()
    peer.signal(signal.SIGTERM)
    assert peer.proc.wait(20) == 0
    assert time.monotonic() - started < 15
