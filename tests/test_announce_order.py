"""A peer's announcements land in the order it made them, even when one is slow (peer/server.py _store_record)."""

from __future__ import annotations

import asyncio
import time

import pytest

from client.local_swarm import LocalSwarm
from peer.config import PeerConfig
from peer.server import PeerServer
from swarm.types import LayerRange, PeerRecord, PeerState
from tests.test_serve_as_loaded import started

pytestmark = pytest.mark.slow


def test_a_slow_older_announcement_never_overwrites_a_newer_state(tiny_model_factory, local_swarm: LocalSwarm) -> None:
    model = tiny_model_factory("llama", 4)
    local_swarm.start_dht()
    name = model.resolve().name

    async def scenario() -> None:
        server = PeerServer(PeerConfig(model, LayerRange(0, 4), name, initial_peers=tuple(local_swarm.initial_peers)))
        async with started(server, local_swarm) as (client, _):
            real_announce, delayed = server.node.announce, []

            def slow_first(record: PeerRecord, ttl: float) -> bool:  # the real DHT store, the first one after a pause (a slow link)
                if not delayed:
                    delayed.append(record.state)
                    time.sleep(1.0)
                return real_announce(record, ttl)

            server.node.announce = slow_first
            older = asyncio.ensure_future(server._announce())  # ONLINE, stuck in its store
            await asyncio.sleep(0.2)
            server.state = PeerState.DRAINING
            await server._announce()  # built later: must be what the DHT keeps
            await older
            assert delayed == [PeerState.ONLINE]
            record = (await client.fetch_view_async(name, 4)).records[server.peer_id]
            assert record.state is PeerState.DRAINING

    asyncio.run(scenario())
