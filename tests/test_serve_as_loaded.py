"""A moving peer given a load order serves each layer as it arrives (real peers, real DHT, real streams).

A standby moves to layers one crash from dark (peer/balancer.py standby_loop passes
routing.standby_load_order): every layer it serves after one layer's load guards it a whole
window's load sooner. The partial ranges must be announced as they grow, compute what the
checkpoint computes, and keep their sessions as the range grows.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from client.local_swarm import LocalSwarm
from peer.config import PeerConfig
from peer.engine import ServingEngine
from peer.server import PeerServer
from shards.batch import BatchLayout
from shards.resolve import resolve_for_peer
from shards.shard import Shard
from swarm.connection import PeerStream
from swarm.dht import SwarmNode
from swarm.types import LayerRange, PeerRecord, PeerState
from tests.hub_server import HubRepo, HubServer, split_checkpoint
from tests.test_peer_protocol import HIDDEN, open_session, step

pytestmark = pytest.mark.slow

HUB_REPO = "test-org/tiny-llama"
HUB_COMMIT = "89abcdef0123456789abcdef0123456789abcdef"


class RecordingPeer(PeerServer):
    """A PeerServer that keeps every record it announces and runs `on_served(served)` once each
    partial range can run (the loading thread waits for it, so the check sees that exact range)."""

    def __init__(self, config: PeerConfig, on_served: Callable[[LayerRange], Awaitable[None]]) -> None:
        super().__init__(config)
        self.announced: list[PeerRecord] = []
        self.on_served = on_served

    async def _announce(self) -> None:
        self.announced.append(self.record())
        await super()._announce()

    async def _serve_grown(self, engine: ServingEngine, served: LayerRange, throughput: float,
                           target: LayerRange) -> None:
        await super()._serve_grown(engine, served, throughput, target)
        await self.on_served(served)


class Reference:
    """One session through a peer's layers [start, end) next to the same layers run locally."""

    def __init__(self, model: Path, stream: PeerStream, start: int, end: int) -> None:
        self.stream, self.local = stream, Shard.from_pretrained(model, start, end)
        self.cache, self.position, self.steps = self.local.new_cache(8, 16), 0, 0

    async def check(self, tokens: int) -> None:
        x = torch.randn(tokens, HIDDEN)
        remote = await step(self.stream, x, self.position, self.steps)
        expected = self.local.forward(x, BatchLayout([tokens], [self.position], [list(range(8))], 16), self.cache)
        assert torch.allclose(remote, expected, atol=1e-5), f"step {self.steps}: {(remote - expected).abs().max()}"
        self.position, self.steps = self.position + tokens, self.steps + 1


def partial_records(server: RecordingPeer, target: LayerRange) -> list[PeerRecord]:
    return [r for r in server.announced if r.moving_to == target and r.layers != server.announced[0].layers]


def served_by_one_peer(tiny_model_factory, local_swarm: LocalSwarm) -> Path:
    """An 8-layer tiny model whose every layer a fixed 0:8 peer serves: moves elsewhere stay covered."""
    model: Path = tiny_model_factory("llama", 8)
    local_swarm.start_dht()
    local_swarm.start_peer(model, "0:8")
    return model


@asynccontextmanager
async def started(server: RecordingPeer, swarm: LocalSwarm) -> AsyncIterator[tuple[SwarmNode, Any]]:
    """`server` started, with a client node and its p2p to reach it; all stopped on the way out."""
    client = SwarmNode(initial_peers=swarm.initial_peers, client_mode=True)
    p2p = await client.replicate_p2p()
    try:
        await server.start()
        yield client, p2p
    finally:
        await server.stop()
        await p2p.shutdown()
        client.shutdown()


def test_a_move_with_a_load_order_serves_each_layer_as_it_arrives(
    tiny_model_factory, local_swarm: LocalSwarm
) -> None:
    model = served_by_one_peer(tiny_model_factory, local_swarm)
    name = model.resolve().name

    async def scenario() -> None:
        sessions: dict[str, Reference] = {}

        async def on_served(served: LayerRange) -> None:
            if served == LayerRange(5, 7):  # mid-load: a session on the partial range computes right
                stream = await open_session(p2p, server.peer_id, layers=[5, 7])
                sessions["partial"] = Reference(model, stream, 5, 7)
                await sessions["partial"].check(6)
                await sessions["partial"].check(1)

        config = PeerConfig(model, LayerRange(0, 4), name, initial_peers=tuple(local_swarm.initial_peers),
                            move_mode="beside")
        server = RecordingPeer(config, on_served)
        async with started(server, local_swarm) as (client, p2p):
            deadline = time.monotonic() + 20
            while len((await client.fetch_view_async(name, 8)).online()) < 2:
                assert time.monotonic() < deadline, "the two peers never showed in the view"
                await asyncio.sleep(0.2)
            server.announced.clear()
            # Beside: 0:4 serves on until layer 6 can run, then the range grows 6:7, 5:7, 5:8, 4:8.
            assert await server.migrate(LayerRange(4, 8), [6, 5, 7, 4]) is True
            partial = partial_records(server, LayerRange(4, 8))
            assert [r.layers for r in partial] == [LayerRange(6, 7), LayerRange(5, 7), LayerRange(5, 8)]
            assert all(r.state is PeerState.ONLINE for r in partial)
            # Through the move's confirmation it announces the move but no load order (it may step back, and its
            # layers come a confirmation later than the order says); as its load starts, the layers to come, in
            # order (routing.move_load_order), and each announcement after names those still to come.
            confirming, loading = server.announced[0], server.announced[1]
            assert confirming.moving_to == LayerRange(4, 8) and confirming.loading_order is None
            assert (loading.layers, loading.moving_to, loading.loading_order) == (LayerRange(0, 4), LayerRange(4, 8),
                                                                                  (6, 5, 7, 4))
            assert [r.loading_order for r in partial] == [(5, 7, 4), (7, 4), (4,)]
            # One layer's speed, measured on the first to arrive, over the layers served.
            speeds = [r.throughput * len(r.layers) for r in partial]
            assert speeds[0] > 0 and max(speeds) == pytest.approx(min(speeds))
            final = server.announced[-1]
            assert final.layers == LayerRange(4, 8) and final.moving_to is None and final.state is PeerState.ONLINE
            assert final.loading_order is None
            assert not any(r.downloading for r in server.announced)  # a local checkpoint loads from disk
            assert final.throughput == pytest.approx(speeds[0] / 4)
            assert len({r.fingerprint for r in partial + [final]}) == 4  # each range has its own
            # The session opened on 5:7 mid-load kept its layers as the range grew.
            await sessions["partial"].check(1)
            assert server.migrations == 1

            # In place: 4:8 is freed first (announced JOINING on the target), then 0:4 grows 3:4 ... 0:4.
            server.config = dataclasses.replace(server.config, move_mode="in-place")
            server.announced.clear()
            assert await server.migrate(LayerRange(0, 4), [3, 2, 1, 0]) is True
            # Through the move's confirmation it serves 4:8 on, announced as moving to 0:4; JOINING there
            # only as it frees 4:8.
            first = server.announced[0]
            assert (first.state, first.layers, first.moving_to) == (PeerState.ONLINE, LayerRange(4, 8), LayerRange(0, 4))
            assert any(r.state is PeerState.JOINING and r.layers == LayerRange(0, 4) and r.loading_order == (3, 2, 1, 0)
                       for r in server.announced)
            partial = partial_records(server, LayerRange(0, 4))
            assert [r.layers for r in partial] == [LayerRange(3, 4), LayerRange(2, 4), LayerRange(1, 4)]
            assert server.announced[-1].layers == LayerRange(0, 4) and server.announced[-1].moving_to is None
            whole = Reference(model, await open_session(p2p, server.peer_id), 0, 4)
            await whole.check(5)
            await whole.check(1)
            view = await client.fetch_view_async(name, 8)
            assert view.records[server.peer_id].layers == LayerRange(0, 4) and view.uncovered_layers() == []

    asyncio.run(scenario())


def test_a_move_of_a_hub_model_serves_each_layer_as_its_files_arrive(
    tiny_model_factory, local_swarm: LocalSwarm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer of a Hub model whose background prefetch is not done downloads a move's files a layer at a time, in its
    load order: each layer serves once its own files are in, not the range's (shards.resolve.LayerFetcher). Its
    records say `downloading` from the load's start until the last layer's files are in (on dark layers a reaction
    counts it only where it serves, routing.downloads); the whole range's record no longer says it."""
    model = served_by_one_peer(tiny_model_factory, local_swarm)
    name = model.resolve().name
    weight_map = split_checkpoint(model, tmp_path / "repo")

    def files_of(layers: range) -> set[str]:
        return {f for n, f in weight_map.items() if any(n.startswith(f"model.layers.{i}.") for i in layers)}

    async def scenario(hub: HubServer) -> None:
        seen: list[tuple[LayerRange, set[str]]] = []  # each served range, and the layer files fetched by then

        async def on_served(served: LayerRange) -> None:
            seen.append((served, hub.downloaded(HUB_REPO) & files_of(range(8))))

        source = resolve_for_peer(HUB_REPO, None, (0, 4))  # what swarm-peer serve fetches before it starts
        config = PeerConfig(source.path, LayerRange(0, 4), name, initial_peers=tuple(local_swarm.initial_peers),
                            move_mode="in-place", model_repo=HUB_REPO)
        server = RecordingPeer(config, on_served)
        async with started(server, local_swarm) as (_, p2p):
            assert not server.moves_load_from_disk.is_set()  # no prefetch (fixed layers): its moves download
            assert hub.downloaded(HUB_REPO) & files_of(range(4, 8)) == set()
            server.announced.clear()
            assert await server.migrate(LayerRange(4, 8), [7, 6, 5, 4]) is True
            assert [(str(served), fetched) for served, fetched in seen] == [
                (str(LayerRange(start, 8)), files_of(range(0, 4)) | files_of(range(start, 8))) for start in (7, 6, 5, 4)
            ]  # each layer served with its own files in and the next layer's not yet fetched
            loading = [r for r in server.announced if r.loading_order]
            assert loading[0].loading_order == (7, 6, 5, 4) and loading[0].downloading  # announced as the load starts
            partial = partial_records(server, LayerRange(4, 8))
            assert [r.layers for r in partial] == [LayerRange(7, 8), LayerRange(6, 8), LayerRange(5, 8)]
            assert all(r.downloading for r in partial)  # layer 4's files were still to come
            whole = [r for r in server.announced if r.layers == LayerRange(4, 8) and r.state is PeerState.ONLINE]
            assert whole and not any(r.downloading for r in whole)
            session = Reference(model, await open_session(p2p, server.peer_id), 4, 8)
            await session.check(3)  # the fetched files compute what the checkpoint computes

    with HubServer({HUB_REPO: HubRepo(tmp_path / "repo", HUB_COMMIT)}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.delenv("HF_HUB_CACHE", raising=False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        asyncio.run(scenario(hub))


def test_a_load_order_that_does_not_grow_one_range_is_refused(tiny_model_factory) -> None:
    model: Path = tiny_model_factory("llama", 8)
    with pytest.raises(ValueError, match="does not grow one range"):
        ServingEngine.load(str(model), LayerRange(4, 8), dtype=torch.float32, device="cpu", quant="none",
                           quant_group_size=128, num_pages=4, page_size=16, max_length=32, order=[4, 6, 5, 7],
                           on_grow=lambda engine, served: None)


async def no_check(served: LayerRange) -> None:
    return None


async def check_growing_join(server: RecordingPeer, model: Path, p2p: Any, standby: bool) -> list[PeerRecord]:
    """What every growing join must show: JOINING on its window, then ONLINE on one range inside it
    that grows by a layer per announcement at either end, then ONLINE on the whole window (a join,
    not a move); a session through the whole window equals local shards. Returns the partial records."""
    target = server.layers
    assert target is not None
    first = server.announced[0]
    assert first.state is PeerState.JOINING and first.layers == target and first.standby == standby
    assert first.loading_order is not None and sorted(first.loading_order) == list(range(target.start, target.end))
    partial = [r for r in server.announced if r.moving_to == target]
    assert [len(r.layers) for r in partial] == list(range(1, len(target)))
    assert all(r.state is PeerState.ONLINE and target.covers(r.layers) for r in partial)
    # Each names the layers still to come, in the order first announced.
    assert all(r.loading_order == tuple(layer for layer in first.loading_order if layer not in r.layers)
               for r in partial)
    assert all(b.layers.covers(a.layers) for a, b in zip(partial, partial[1:]))  # one range, growing at either end
    final = server.announced[-1]
    assert final.layers == target and final.moving_to is None and final.state is PeerState.ONLINE
    assert final.loading_order is None
    assert server.migrations == 0  # a join, not a move
    whole = Reference(model, await open_session(p2p, server.peer_id), target.start, target.end)
    await whole.check(4)
    await whole.check(1)
    return partial


def test_a_standby_joins_serving_each_layer_as_it_arrives(tiny_model_factory, local_swarm: LocalSwarm) -> None:
    model = served_by_one_peer(tiny_model_factory, local_swarm)  # each layer one crash from dark
    name = model.resolve().name

    async def scenario() -> None:
        config = PeerConfig(model, None, name, initial_peers=tuple(local_swarm.initial_peers), standby=True,
                            num_layers=4)
        server = RecordingPeer(config, no_check)
        async with started(server, local_swarm) as (_, p2p):
            assert server.layers is not None and len(server.layers) == 4
            await check_growing_join(server, model, p2p, standby=True)

    asyncio.run(scenario())


def test_a_self_placing_peer_joins_serving_each_layer_as_it_arrives_gaps_first(
        tiny_model_factory, local_swarm: LocalSwarm) -> None:
    """A GPU peer's join grows as its moves do (peer/balancer.py choose_initial_layers passes
    routing.move_load_order): layers nobody serves come first, each served as it arrives."""
    model: Path = tiny_model_factory("llama", 8)
    name = model.resolve().name
    local_swarm.start_dht()
    local_swarm.start_peer(model, "0:4")  # 4:8 dark: a 6-layer joiner takes 2:8 and loads 4:8 first

    async def scenario() -> None:
        config = PeerConfig(model, None, name, initial_peers=tuple(local_swarm.initial_peers), num_layers=6)
        server = RecordingPeer(config, no_check)
        async with started(server, local_swarm) as (_, p2p):
            assert server.layers == LayerRange(2, 8)
            partial = await check_growing_join(server, model, p2p, standby=False)
            assert LayerRange(4, 8).covers(partial[3].layers), "a served layer loaded before a gap"
            assert server.throughput > 0

    asyncio.run(scenario())


def test_a_cancelled_growing_move_serves_what_has_arrived_and_grows_no_further(
    tiny_model_factory, local_swarm: LocalSwarm
) -> None:
    model = served_by_one_peer(tiny_model_factory, local_swarm)
    name = model.resolve().name

    async def scenario() -> None:
        moving: list[asyncio.Task] = []

        async def on_served(served: LayerRange) -> None:
            if served == LayerRange(4, 6):  # a drain cancels the balancer mid-move
                moving[0].cancel()
                await asyncio.sleep(0.05)  # the cancellation lands while the loading thread waits here

        config = PeerConfig(model, LayerRange(0, 4), name, initial_peers=tuple(local_swarm.initial_peers),
                            move_mode="beside")
        server = RecordingPeer(config, on_served)
        async with started(server, local_swarm) as (_, p2p):
            moving.append(asyncio.create_task(server.migrate(LayerRange(4, 8), [4, 5, 6, 7])))
            with pytest.raises(asyncio.CancelledError):
                await moving[0]
            await asyncio.sleep(1.0)  # a loading thread that went on would have grown the range by now
            assert server.layers == LayerRange(4, 6) and server.migrations == 0
            record = server.record()
            assert record.layers == LayerRange(4, 6) and record.moving_to is None and record.state is PeerState.ONLINE
            partial = Reference(model, await open_session(p2p, server.peer_id), 4, 6)
            await partial.check(3)

    asyncio.run(scenario())
