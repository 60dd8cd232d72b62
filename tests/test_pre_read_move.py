"""A peer moving in place reads its target into the page cache first, serving its old range meanwhile
(--pre-read; real peers, real DHT, real streams, the page cache read with mincore)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest

from client.local_swarm import LocalSwarm
from peer.config import PeerConfig
from peer.server import PeerServer
from shards.pre_read import layer_spans
from swarm.types import LayerRange, PeerState, SwarmView
from tests.page_cache import evict, span_resident
from tests.test_peer_protocol import open_session
from tests.test_serve_as_loaded import Reference

pytestmark = pytest.mark.slow


class PreReadingPeer(PeerServer):
    """A PeerServer that, right after each pre-read, checks what a client and the page cache see."""

    def __init__(self, config: PeerConfig, p2p_of_client: list) -> None:
        super().__init__(config)
        self.pre_reads: list[LayerRange] = []
        self.checked: list[str] = []
        self.p2p_of_client = p2p_of_client

    async def _pre_read(self, target: LayerRange) -> None:
        await super()._pre_read(target)
        self.pre_reads.append(target)
        # The read is done and the old range not yet freed: the target is in memory, the old range serves.
        assert all(span_resident(s) for s in layer_spans(self.config.model_path, target.start, target.end))
        assert self.layers == LayerRange(0, 4) and self.engine is not None and self.record().state is PeerState.ONLINE
        old = Reference(self.config.model_path, await open_session(self.p2p_of_client[0], self.peer_id), 0, 4)
        await old.check(5)
        await old.check(1)
        self.checked.append("old range served after the read")


def test_an_in_place_move_reads_its_target_into_memory_first_unless_the_target_has_a_gap(
    tiny_model_factory, local_swarm: LocalSwarm
) -> None:
    model: Path = tiny_model_factory("llama", 8)
    local_swarm.start_dht()
    # A fixed 0:8 peer keeps every move covered. In bfloat16 it holds copies: a float32 load of this float32
    # checkpoint keeps views of the mapped file, and pages a process maps cannot be evicted.
    local_swarm.start_peer(model, "0:8", "--dtype", "bfloat16")
    name = model.resolve().name
    target_spans = layer_spans(model, 4, 8)

    async def scenario() -> None:
        from swarm.dht import SwarmNode

        client = SwarmNode(initial_peers=local_swarm.initial_peers, client_mode=True)
        p2p = await client.replicate_p2p()
        config = PeerConfig(model, LayerRange(0, 4), name, initial_peers=tuple(local_swarm.initial_peers),
                            move_mode="in-place")
        server = PreReadingPeer(config, [p2p])
        try:
            await server.start()
            deadline = time.monotonic() + 20
            while len((view := await client.fetch_view_async(name, 8)).online()) < 2:
                assert time.monotonic() < deadline, "the two peers never showed in the view"
                await asyncio.sleep(0.2)
            for file in model.glob("*.safetensors"):
                evict(file)
            # The peer's own 0:4, loaded as views of the mapped file, keeps its pages (and a few of 4:8's
            # beside them, mapped around its faults) in memory; the rest of 4:8 is on disk alone now.
            if all(span_resident(s) for s in target_spans):
                pytest.skip("this filesystem keeps evicted pages (posix_fadvise DONTNEED is a hint)")

            assert await server.migrate(LayerRange(4, 8), None, view) is True
            assert server.pre_reads == [LayerRange(4, 8)] and server.checked == ["old range served after the read"]
            moved = Reference(model, await open_session(p2p, server.peer_id), 4, 8)
            await moved.check(5)
            await moved.check(1)

            # A target with a layer no GPU peer served when the move was decided loads at once: as seen
            # without the fixed peer's record, 0:4 is a gap.
            view = await client.fetch_view_async(name, 8)
            gap = SwarmView(view.model, view.num_layers, {server.peer_id: view.records[server.peer_id]}, view.rtt)
            assert gap.uncovered_layers(standbys=False) == [0, 1, 2, 3]
            assert await server.migrate(LayerRange(0, 4), None, gap) is True
            assert server.pre_reads == [LayerRange(4, 8)] and server.layers == LayerRange(0, 4)
            # --no-pre-read, or a standby (it moves to layers one crash from dark), never reads ahead.
            assert server._pre_reads(LayerRange(4, 8), view)
            server.config = dataclasses.replace(config, pre_read=False)
            assert not server._pre_reads(LayerRange(4, 8), view)
            server.config = dataclasses.replace(config, standby=True)
            assert not server._pre_reads(LayerRange(4, 8), view)
        finally:
            await server.stop()
            await p2p.shutdown()
            client.shutdown()

    asyncio.run(scenario())
