"""A peer back on layers it served before attaches none of the prefix pages its old KV cache held.

Each move builds a new engine with a new KV cache, but the page pool and its prefix cache outlive
it. A page registered on layers 0:4 names its prefix by those layers' fingerprint, so a peer that
moves 0:4 -> 4:8 -> 0:4 (or whose failed load loads the old range again) would find that page's
hash again and attach it: its KV and stored outputs were in the old cache, and the session's
results would be garbage. Real peers, real DHT, real streams.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import torch

from client.local_swarm import LocalSwarm
from peer.config import PeerConfig
from shards.batch import BatchLayout
from shards.shard import Shard
from swarm import messages as m
from swarm.codec import Limits, encode_tensor
from swarm.connection import PeerStream
from swarm.types import LayerRange
from tests.test_peer_protocol import HIDDEN, open_session
from tests.test_serve_as_loaded import RecordingPeer, served_by_one_peer, started

pytestmark = pytest.mark.slow

PAGE = 16


async def step_with_ids(stream: PeerStream, hidden: torch.Tensor, token_ids: list[int]) -> torch.Tensor:
    """A session's first step, with the token ids that let the peer share (and look up) prefix pages."""
    reply = await stream.request(
        {"type": m.STEP, "step_id": 1, "hidden": encode_tensor(hidden), "new_tokens": [hidden.shape[0]],
         "positions": [0], "token_ids": [token_ids]},
        timeout=30,
    )
    return m.require_tensor(reply, "hidden", Limits(), ndim=2)


def test_a_peer_back_on_its_old_layers_computes_instead_of_attaching_stale_pages(
    tiny_model_factory, local_swarm: LocalSwarm
) -> None:
    model: Path = served_by_one_peer(tiny_model_factory, local_swarm)  # a fixed 0:8 peer: moves leave nothing dark
    local = Shard.from_pretrained(model, 0, 4)
    hidden, ids = torch.randn(PAGE + 1, HIDDEN), list(range(3, PAGE + 4))  # one full page, and one more row
    expected = local.forward(hidden, BatchLayout([PAGE + 1], [0], [[0, 1]], PAGE), local.new_cache(2, PAGE))

    async def nothing(served: LayerRange) -> None:
        return None

    async def scenario() -> None:
        config = PeerConfig(model, LayerRange(0, 4), model.resolve().name, initial_peers=tuple(local_swarm.initial_peers),
                            move_mode="in-place", page_size=PAGE)
        server = RecordingPeer(config, nothing)
        async with started(server, local_swarm) as (client, p2p):
            deadline = time.monotonic() + 20
            while len((await client.fetch_view_async(config.model_name, 8)).online()) < 2:
                assert time.monotonic() < deadline, "the two peers never showed in the view"
                await asyncio.sleep(0.2)
            first = await open_session(p2p, server.peer_id)
            assert torch.allclose(await step_with_ids(first, hidden, ids), expected, atol=1e-5)
            await first.close()  # its full page stays cached for the next session with these ids
            again = await open_session(p2p, server.peer_id)
            assert torch.allclose(await step_with_ids(again, hidden, ids), expected, atol=1e-5)
            assert server.registry.prefix.hits == 1  # shared while the engine that computed it serves
            await again.close()

            assert await server.migrate(LayerRange(4, 8)) is True
            assert await server.migrate(LayerRange(0, 4)) is True
            back = await open_session(p2p, server.peer_id)
            out = await step_with_ids(back, hidden, ids)
            assert torch.allclose(out, expected, atol=1e-5), f"max error {(out - expected).abs().max()}"
            assert server.registry.prefix.hits == 1  # computed, not attached from the old cache

    asyncio.run(scenario())
