"""A self-placing peer reads a periodic move's layers into the page cache before it moves, serving on and
announcing nothing meanwhile; a crash notice stops the read (--pre-read; real peers, real DHT, real
streams, the page cache read with mincore). The whole loop, read then decided again, runs in
tests/test_flow_move_gap.py."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest

from client.local_swarm import LocalSwarm
from peer.balancer import pre_read_unless_woken, pre_reads_first
from peer.config import PeerConfig
from peer.server import PeerServer
from shards.pre_read import layer_spans
from swarm.dht import SwarmNode
from swarm.types import LayerRange, PeerState, SwarmView
from tests.page_cache import evict, span_resident
from tests.test_peer_protocol import open_session
from tests.test_serve_as_loaded import Reference

pytestmark = pytest.mark.slow


def test_a_pre_read_fills_the_page_cache_while_the_peer_serves_on_and_a_crash_notice_stops_it(
    tiny_model_factory, local_swarm: LocalSwarm
) -> None:
    model: Path = tiny_model_factory("llama", 8)
    name = model.resolve().name
    local_swarm.start_dht()
    # A fixed 0:8 peer. In bfloat16 it holds copies: a float32 load of this float32 checkpoint keeps views
    # of the mapped file, and pages a process maps cannot be evicted.
    local_swarm.start_peer(model, "0:8", "--dtype", "bfloat16")
    target = LayerRange(4, 8)

    async def scenario() -> None:
        client = SwarmNode(initial_peers=local_swarm.initial_peers, client_mode=True)
        p2p = await client.replicate_p2p()
        server = PeerServer(PeerConfig(model, LayerRange(0, 4), name, initial_peers=tuple(local_swarm.initial_peers),
                                       pre_read=True))
        try:
            await server.start()
            deadline = time.monotonic() + 20
            while len((view := await client.fetch_view_async(name, 8)).online()) < 2:
                assert time.monotonic() < deadline, "the two peers never showed in the view"
                await asyncio.sleep(0.2)
            placement = server._placement()
            for file in model.glob("*.safetensors"):
                evict(file)
            # The peer's own 0:4, loaded as views of the mapped file, keeps its pages (and a few of 4:8's
            # beside them, mapped around its faults) in memory; the rest of 4:8 is on disk alone now.
            if all(span_resident(s) for s in layer_spans(model, target.start, target.end)):
                pytest.skip("this filesystem keeps evicted pages (posix_fadvise DONTNEED is a hint)")
            old = Reference(model, await open_session(p2p, server.peer_id), 0, 4)
            await old.check(5)

            assert pre_reads_first(placement, view, target)
            assert await pre_read_unless_woken(placement, target) is True
            assert all(span_resident(s) for s in layer_spans(model, target.start, target.end))
            # Nothing was announced or given up: the same record, and the open session goes on.
            record = server.record()
            assert (record.layers, record.state, record.moving_to) == (LayerRange(0, 4), PeerState.ONLINE, None)
            assert server.migrations == 0
            await old.check(1)

            # A crash notice (placement.wake) stops the read and is left set for the watch to decide on.
            placement.wake.set()
            assert await pre_read_unless_woken(placement, target) is False
            assert placement.wake.is_set()

            # No read for a target with a layer no GPU peer serves (its first layer must light at once),
            # nor without --pre-read.
            gap = SwarmView(view.model, view.num_layers, {server.peer_id: view.records[server.peer_id]}, view.rtt)
            assert gap.uncovered_layers(standbys=False) == [4, 5, 6, 7]
            assert not pre_reads_first(placement, gap, target)
            assert not pre_reads_first(dataclasses.replace(placement, config=dataclasses.replace(server.config,
                                                                                            pre_read=False)),
                                  view, target)
        finally:
            await server.stop()
            await p2p.shutdown()
            client.shutdown()

    asyncio.run(scenario())
