"""Two peers that decide at the same moment to leave one range never both go (real peers, real DHT), also when
the first goes without confirming (peer/balancer.py must_confirm)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from client.local_swarm import LocalSwarm
from peer.balancer import MOVE_CONFIRM_S, must_confirm
from peer.config import PeerConfig
from peer.server import PeerServer
from swarm.types import LayerRange, PeerState

pytestmark = pytest.mark.slow


@contextlib.asynccontextmanager
async def two_peers_on_0_4(model_path: Path, local_swarm: LocalSwarm) -> AsyncIterator[tuple[PeerServer, PeerServer]]:
    """Two in-process peers on 0:4 beside a peer process on 4:8 (started by the caller), all three in the view."""
    config = PeerConfig(model_path, LayerRange(0, 4), model_path.resolve().name,
                        initial_peers=tuple(local_swarm.initial_peers), move_mode="beside")
    a, b = PeerServer(config), PeerServer(config)
    try:
        await a.start()
        await b.start()
        deadline = time.monotonic() + 20
        while len((await a.node.fetch_view_async(config.model_name, 8)).online()) < 3:
            assert time.monotonic() < deadline, "the three peers never showed in the view"
            await asyncio.sleep(0.2)
        yield a, b
    finally:
        await asyncio.gather(a.stop(), b.stop(), return_exceptions=True)


def test_two_peers_leaving_one_range_at_once_never_both_go(
    tiny_model_factory, local_swarm: LocalSwarm
) -> None:
    model_path: Path = tiny_model_factory("llama", 8)
    name = model_path.resolve().name
    local_swarm.start_dht()
    local_swarm.start_peer(model_path, "4:8")  # keeps 4:8 served; 0:4 has exactly the two peers below

    async def scenario() -> None:
        async with two_peers_on_0_4(model_path, local_swarm) as (a, b):
            # Each alone may leave 0:4 (the other keeps it), so both decide to, at the same moment. Each
            # announces its move, reads the view a second later, and stays if the other is leaving too.
            # Each store is awaited before the read, so at least one of the two sees the other's: at
            # most one goes. Usually both see each other and stay; on a loaded machine a slow store
            # can let the first reader miss the second's, and then that one goes alone.
            results = await asyncio.gather(a.migrate(LayerRange(4, 8)), b.migrate(LayerRange(4, 8)))
            assert results != [True, True], "both peers left 0:4 at once"
            view = await a.node.fetch_view_async(name, 8)
            for server, moved in zip((a, b), results):
                record = view.records[server.peer_id]
                assert record.state is PeerState.ONLINE and record.moving_to is None  # a step back is announced at once
                assert record.layers == (LayerRange(4, 8) if moved else LayerRange(0, 4))
            assert view.uncovered_layers() == [] and a.migrations + b.migrations == sum(results)
            # One at a time, the first goes and the second, now 0:4's only server, may not.
            if results == [False, False]:
                assert await a.migrate(LayerRange(4, 8)) is True
            mover, stayer = (a, b) if a.layers == LayerRange(4, 8) else (b, a)
            assert mover.layers == LayerRange(4, 8)
            assert await stayer.migrate(LayerRange(4, 8)) is False and stayer.layers == LayerRange(0, 4)
            assert (await stayer.node.fetch_view_async(name, 8)).uncovered_layers() == []

    asyncio.run(scenario())


def test_the_first_goes_at_once_and_the_second_confirms_and_stays(
    tiny_model_factory, local_swarm: LocalSwarm
) -> None:
    model_path: Path = tiny_model_factory("llama", 8)
    name = model_path.resolve().name
    local_swarm.start_dht()
    local_swarm.start_peer(model_path, "4:8")

    async def scenario() -> None:
        async with two_peers_on_0_4(model_path, local_swarm) as (a, b):
            first, second = sorted((a, b), key=lambda s: s.peer_id)
            # Both react at the same moment; must_confirm lets the lower id go at once and makes the other confirm.
            view = await a.node.fetch_view_async(name, 8)
            assert must_confirm(view, first.peer_id, 1.0) is False and must_confirm(view, second.peer_id, 1.0) is True
            started = time.monotonic()
            results = await asyncio.gather(first.migrate(LayerRange(4, 8), None, None, 0.0),
                                           second.migrate(LayerRange(4, 8), None, None, MOVE_CONFIRM_S))
            assert results == [True, False]  # the second saw the first leaving 0:4 and stayed
            assert first.layers == LayerRange(4, 8) and second.layers == LayerRange(0, 4)
            assert (await a.node.fetch_view_async(name, 8)).uncovered_layers() == []
            assert time.monotonic() - started >= MOVE_CONFIRM_S  # the second waited its confirmation

    asyncio.run(scenario())
