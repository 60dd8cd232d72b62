"""Peers place themselves where the swarm is weakest and move to close gaps (real processes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from client import ClientConfig, DistributedModel
from client.local_swarm import LocalSwarm, SwarmProcess
from swarm.dht import SwarmNode
from swarm.types import LayerRange
from tests.swarm_processes import wait_until

pytestmark = pytest.mark.slow
PERIOD = "2"  # --balance-period in seconds: short, so the test sees moves quickly
TTL = "3"  # --announce-ttl: a killed peer's record vanishes this fast


def served_ranges(node: SwarmNode, model: str) -> dict[str, LayerRange]:
    return {r.peer_id: r.layers for r in node.fetch_view(model).online()}



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
        wait_until(lambda: len(served_ranges(node, name)) == 3, 20, "3 records", poll=0.5)
        # Three peers of 10 layers on a 30-layer model: spread over every layer (none may move:
        # each range is the only copy, so leaving would uncover it).
        assert set(served_ranges(node, name).values()) == {LayerRange(0, 10), LayerRange(10, 20), LayerRange(20, 30)}
        movers.append(local_swarm.start_peer(model_path, None, "--num-layers", "10", "--balance-period", PERIOD,
                                             "--announce-ttl", TTL, "--move-mode", "in-place"))
        wait_until(lambda: len(served_ranges(node, name)) == 4, 20, "4 records", poll=0.5)
        ranges = served_ranges(node, name)
        assert ranges[fixed.peer_id] == LayerRange(0, 10)
        assert node.fetch_view(name).uncovered_layers() == []

        # While a client is generating, kill a self-placing peer that is then the only server of
        # some layer: it is on every route (movers may have shifted since the ranges above).
        def sole_mover() -> tuple[SwarmProcess, LayerRange]:
            now = served_ranges(node, name)
            for m in movers:
                mine = now.get(m.peer_id)
                others = [r for p, r in now.items() if p != m.peer_id]
                if mine is not None and any(not any(layer in r for r in others) for layer in range(mine.start, mine.end)):
                    return m, mine
            raise AssertionError(f"no mover is the only server of a layer: {now}")

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
                    KillAt.victim, KillAt.gap = sole_mover()
                    KillAt.victim.kill()

            def end(self) -> None:
                pass

        try:
            out = model.generate(ids, max_new_tokens=24, streamer=KillAt())
            assert torch.equal(out, expected)
            assert model.last_session.stats.failovers >= 1
        finally:
            model.close()
        # Someone moved into the gap within 2 x balance period (+ record expiry and loading).
        victim, gap = KillAt.victim, KillAt.gap

        def gap_closed() -> bool:
            view = node.fetch_view(name)
            return victim.peer_id not in view.records and view.uncovered_layers() == []

        wait_until(gap_closed, 2 * float(PERIOD) * 1.25 + float(TTL) + 10, f"the layers of {gap} to be served again", poll=0.5)
        assert served_ranges(node, name)[fixed.peer_id] == LayerRange(0, 10), "a fixed --layers peer moved"
        assert node.fetch_view(name).uncovered_layers() == []
        # In place, as a GPU filled by its own layers moves (tests/test_drain.py moves beside).
        assert any("in place (--move-mode in-place)" in m.log_text() and "now serving layers" in m.log_text()
                   for m in movers if m is not victim), "nobody migrated in place"
        assert "moving from" not in fixed.log_text()
    finally:
        node.shutdown()
