"""Two peers that decide at the same moment to leave one range both step back (real peers, real DHT)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from client.local_swarm import LocalSwarm
from peer.config import PeerConfig
from peer.server import PeerServer
from swarm.types import LayerRange, PeerState

pytestmark = pytest.mark.slow


def test_two_peers_leaving_one_range_at_once_both_stay_then_one_goes(
    tiny_model_factory, local_swarm: LocalSwarm
) -> None:
    model_path: Path = tiny_model_factory("llama", 8)
    name = model_path.resolve().name
    local_swarm.start_dht()
    local_swarm.start_peer(model_path, "4:8")  # keeps 4:8 served; 0:4 has exactly the two peers below

    async def scenario() -> None:
        config = PeerConfig(model_path, LayerRange(0, 4), name, initial_peers=tuple(local_swarm.initial_peers),
                            move_mode="beside")
        a, b = PeerServer(config), PeerServer(config)
        try:
            await a.start()
            await b.start()
            deadline = time.monotonic() + 20
            while len((await a.node.fetch_view_async(name, 8)).online()) < 3:
                assert time.monotonic() < deadline, "the three peers never showed in the view"
                await asyncio.sleep(0.2)
            # Each alone may leave 0:4 (the other keeps it), so both decide to, at the same moment:
            # each announces its move, sees the other's a second later, and stays.
            assert await asyncio.gather(a.migrate(LayerRange(4, 8)), b.migrate(LayerRange(4, 8))) == [False, False]
            view = await a.node.fetch_view_async(name, 8)
            for server in (a, b):
                record = view.records[server.peer_id]
                assert record.layers == LayerRange(0, 4) and record.state is PeerState.ONLINE
                assert record.moving_to is None  # the step back was announced at once
            assert view.uncovered_layers() == [] and a.migrations == b.migrations == 0
            # One at a time, the first goes and the second, now 0:4's only server, may not.
            assert await a.migrate(LayerRange(4, 8)) is True and a.layers == LayerRange(4, 8)
            assert await b.migrate(LayerRange(4, 8)) is False and b.layers == LayerRange(0, 4)
            assert (await b.node.fetch_view_async(name, 8)).uncovered_layers() == []
        finally:
            await asyncio.gather(a.stop(), b.stop(), return_exceptions=True)

    asyncio.run(scenario())
