"""The serving engine through real peer processes: 16 concurrent clients, a full pool, prefix sharing."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from client import DistributedModel
from client.local_swarm import LocalSwarm
from shards.batch import BatchLayout
from shards.shard import Shard
from swarm import messages as m
from swarm.codec import encode_tensor
from swarm.dht import SwarmNode
from swarm.errors import RemoteError
from tests.swarm_processes import new_test_swarm
from tests.test_peer_protocol import info, open_session, step

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine_swarm(tiny_model_factory, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, LocalSwarm]]:
    model = tiny_model_factory("gqa", 6)
    swarm = new_test_swarm(tmp_path_factory.mktemp("engine"))
    try:
        swarm.start_dht()
        peers = [swarm.start_peer(model, "0:6", "--batch-window", "0.005", wait=False),
                 # A tiny pool (16 pages of 4 tokens) under another model name, so clients never route to it.
                 # No per-client page quota: this test fills the whole pool from one client on purpose.
                 swarm.start_peer(model, "0:6", "--model-name", "small-pool", "--cache-tokens", "64", "--page-size", "4",
                                  "--max-client-pages-fraction", "1", "--alloc-timeout", "1.5", wait=False)]
        for peer in peers:  # both load at once
            swarm.wait_online(peer)
        yield model, swarm
    finally:
        swarm.close()


@pytest.fixture(scope="module")
def remote(engine_swarm) -> Iterator[DistributedModel]:
    path, swarm = engine_swarm
    model = DistributedModel.from_pretrained(path, swarm.initial_peers)
    try:
        yield model
    finally:
        model.close()


def peer_stats(model: DistributedModel, peer_id: str) -> dict:
    return model.loop.run(model.swarm.peer_info(peer_id), timeout=40)["stats"]


def stats_once_idle(model: DistributedModel, peer_id: str, timeout: float = 10.0) -> dict:
    """The peer's stats once no session holds pages, or the last ones read after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    stats = peer_stats(model, peer_id)
    while stats["used_pages"] and time.monotonic() < deadline:
        time.sleep(0.1)
        stats = peer_stats(model, peer_id)
    return stats


def prompt(length: int, seed: int) -> torch.Tensor:
    return torch.randint(3, 300, (1, length), generator=torch.Generator().manual_seed(seed))


def test_sixteen_concurrent_clients_generate_what_each_generates_alone(remote, engine_swarm) -> None:
    peer = engine_swarm[1].processes[1].peer_id
    prompts = [prompt(3 + (i * 5) % 17, seed=i) for i in range(16)]
    alone = [remote.generate(p, max_new_tokens=10) for p in prompts]
    before = peer_stats(remote, peer)
    results: list[torch.Tensor | BaseException | None] = [None] * 16
    barrier = threading.Barrier(16)

    def client(i: int) -> None:
        try:
            barrier.wait()
            results[i] = remote.generate(prompts[i], max_new_tokens=10)
        except BaseException as e:  # reported below
            results[i] = e

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i, (got, want) in enumerate(zip(results, alone)):
        assert isinstance(got, torch.Tensor), f"client {i}: {got!r}"
        assert torch.equal(got, want), f"client {i} generated other tokens together than alone"
    after = peer_stats(remote, peer)
    batches = after["batches_run"] - before["batches_run"]
    sequences = after["sequences_run"] - before["sequences_run"]
    assert 16 * 5 <= sequences <= 16 * 10  # a prefill and up to 9 decodes per client (fewer after EOS)
    assert batches < sequences and after["max_batch_sequences"] > 1, (batches, sequences)
    assert after["batches_run"] < after["tokens_run"]


def test_prefix_shared_between_sessions_through_a_peer(remote, engine_swarm) -> None:
    peer = engine_swarm[1].processes[1].peer_id
    system = prompt(64, seed=99)[0].tolist()  # 4 pages of 16 tokens
    before = peer_stats(remote, peer)["prefix_tokens"]

    def run(ids: list[int], share: bool) -> torch.Tensor:
        with remote.inference_session(max_length=128) as session:
            hidden = session.step(remote.head.embed(torch.tensor(ids)), [len(ids)], [ids] if share else None)
            return remote.head.logits(hidden).float()

    first = system + [5, 6, 7]
    second = system + [8, 9]
    shared = [run(first, True), run(second, True)]
    assert peer_stats(remote, peer)["prefix_tokens"] - before == 64, "the second session reused 4 pages"
    for ids, got in zip((first, second), shared):
        assert (got - run(ids, False)).abs().max() < 1e-4
    # A session's Close reaches the peer after the client's `with` ends, so the pages go soon, not at once.
    stats = stats_once_idle(remote, peer)
    assert stats["evictable_pages"] >= 4 and stats["used_pages"] == 0  # all ended: pool empty, prefix cached


async def test_full_pool_busy_for_the_fifth_session_while_four_continue(engine_swarm) -> None:
    path, swarm = engine_swarm
    peer = swarm.processes[2].peer_id
    shard = Shard.from_pretrained(path, 0, 6)
    node = SwarmNode(initial_peers=swarm.initial_peers, client_mode=True)
    p2p = await node.replicate_p2p()
    try:
        torch.manual_seed(5)
        H = shard.config.hidden_size
        streams = [await open_session(p2p, peer, max_length=16) for _ in range(4)]
        inputs = [[torch.randn(13, H)] for _ in range(4)]
        for s, x in zip(streams, inputs):
            await step(s, x[0], 0, 0)  # 13 tokens = 4 pages of 4 each: 16 pages, the pool is full
        fifth = await open_session(p2p, peer, max_length=16)
        waiting = asyncio.ensure_future(step(fifth, torch.randn(5, H), 0, 0))
        for t in range(3):  # the running sessions decode inside their last page meanwhile
            for i, s in enumerate(streams):
                x = torch.randn(1, H)
                inputs[i].append(x)
                got = await step(s, x, 13 + t, t + 1)
                full = torch.cat(inputs[i])
                want = shard.forward(full, BatchLayout([full.shape[0]], [0], [[0, 1, 2, 3]], 4), shard.new_cache(4, 4))
                assert (got - want[-1:]).abs().max() < 1e-4
        with pytest.raises(RemoteError) as caught:
            await waiting
        assert caught.value.code == "busy" and caught.value.retryable and "KV cache full" in caught.value.message
        x5 = torch.randn(5, H)
        waiting = asyncio.ensure_future(step(fifth, x5, 0, 1))
        await asyncio.sleep(0.3)
        await streams[0].request({"type": m.CLOSE}, timeout=10)  # freeing one admits the waiter
        got = await asyncio.wait_for(waiting, 10)
        want = shard.forward(x5, BatchLayout([5], [0], [[0, 1]], 4), shard.new_cache(2, 4))
        assert (got - want).abs().max() < 1e-4
        for s in [*streams, fifth]:
            await s.close()
        for _ in range(50):
            record = (await info(p2p, peer))["record"]
            if record["free_pages"] == 16:
                break
            await asyncio.sleep(0.1)
        assert record["free_pages"] == 16 and record["total_pages"] == 16
    finally:
        await p2p.shutdown()
        node.shutdown()


def test_bad_token_ids_are_refused(engine_swarm, remote) -> None:
    peer = engine_swarm[1].processes[1].peer_id

    async def go() -> str:
        stream = await remote.swarm.open_stream(peer)
        try:
            await stream.request({"type": m.OPEN, "max_length": 8, "batch": 1}, timeout=10)
            try:
                await stream.request({"type": m.STEP, "step_id": 0, "hidden": encode_tensor(torch.zeros(2, 64)),
                                      "new_tokens": [2], "positions": [0], "token_ids": [[1]]}, timeout=10)
            except RemoteError as e:
                return e.code
            return "accepted"
        finally:
            await stream.close()

    assert remote.swarm.loop.run(go(), timeout=30) == "bad_field"

