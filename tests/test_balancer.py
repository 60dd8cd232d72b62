"""Peers place themselves where the swarm is weakest and move to close gaps (real processes)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from client import ClientConfig, DistributedModel
from client.local_swarm import LocalSwarm
from swarm.dht import SwarmNode
from swarm.types import LayerRange

pytestmark = pytest.mark.slow
PERIOD = "2"  # --balance-period in seconds: short, so the test sees moves quickly
TTL = "3"  # --announce-ttl: a killed peer's record vanishes this fast


def served_ranges(node: SwarmNode, model: str) -> dict[str, LayerRange]:
    return {r.peer_id: r.layers for r in node.fetch_view(model).online()}


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.5)


def test_peers_spread_over_layers_then_close_a_gap_while_a_client_generates(
    tiny_model_factory, local_swarm: LocalSwarm
) -> None:
    model_path: Path = tiny_model_factory("llama", 30)
    name = model_path.resolve().name
    local_swarm.start_dht()
    fixed = local_swarm.start_peer(model_path, "0:10", "--announce-ttl", TTL)
    movers = []
    node = SwarmNode(initial_peers=local_swarm.initial_peers, client_mode=True)
    try:
        for _ in range(2):  # started one after another, so each sees the ones before it
            movers.append(local_swarm.start_peer(model_path, None, "--num-layers", "10", "--balance-period", PERIOD,
                                                 "--announce-ttl", TTL, "--move-mode", "in-place"))
        wait_until(lambda: len(served_ranges(node, name)) == 3, 20, "3 records")
        # Three peers of 10 layers on a 30-layer model: spread over every layer (none may move:
        # each range is the only copy, so leaving would uncover it).
        assert set(served_ranges(node, name).values()) == {LayerRange(0, 10), LayerRange(10, 20), LayerRange(20, 30)}
        movers.append(local_swarm.start_peer(model_path, None, "--num-layers", "10", "--balance-period", PERIOD,
                                             "--announce-ttl", TTL, "--move-mode", "in-place"))
        wait_until(lambda: len(served_ranges(node, name)) == 4, 20, "4 records")
        ranges = served_ranges(node, name)
        assert ranges[fixed.peer_id] == LayerRange(0, 10)
        assert node.fetch_view(name).uncovered_layers() == []

        # Kill a self-placing peer whose range nobody else serves, while a client is generating.
        def unique(peer) -> bool:
            return list(ranges.values()).count(ranges[peer.peer_id]) == 1

        victim = next(m for m in movers if unique(m))
        gap = ranges[victim.peer_id]
        ids = torch.randint(3, 300, (1, 10), generator=torch.Generator().manual_seed(5))
        expected = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).generate(
            ids, max_new_tokens=24, do_sample=False)
        config = ClientConfig(step_timeout=3, max_retries=12, retry_backoff=0.5)
        model = DistributedModel.from_pretrained(model_path, local_swarm.initial_peers, config=config)

        class KillAt:
            count = 0

            def put(self, value: torch.Tensor) -> None:
                KillAt.count += 1
                if KillAt.count == 8:
                    victim.kill()
                    KillAt.killed_at = time.monotonic()

            def end(self) -> None:
                pass

        try:
            out = model.generate(ids, max_new_tokens=24, streamer=KillAt())
            assert torch.equal(out, expected)
            assert model.last_session.stats.failovers >= 1
        finally:
            model.close()
        # Someone moved into the gap within 2 x balance period (+ record expiry and loading).
        wait_until(lambda: any(r.covers(gap) for r in served_ranges(node, name).values()),
                   2 * float(PERIOD) * 1.25 + float(TTL) + 10, f"a peer to cover {gap}")
        assert served_ranges(node, name)[fixed.peer_id] == LayerRange(0, 10), "a fixed --layers peer moved"
        assert node.fetch_view(name).uncovered_layers() == []
        # In place, as a GPU filled by its own layers moves (tests/test_drain.py moves beside).
        assert any("in place (--move-mode in-place)" in m.log_text() and "now serving layers" in m.log_text()
                   for m in movers if m is not victim), "nobody migrated in place"
        assert "moving from" not in fixed.log_text()
    finally:
        node.shutdown()
