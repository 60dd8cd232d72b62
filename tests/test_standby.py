"""A standby peer guards sole-served layers: their server crashes, generation goes on (real processes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from client import ClientConfig, DistributedModel
from client.local_swarm import LocalSwarm
from swarm.dht import SwarmNode
from swarm.types import LayerRange
from tests.swarm_processes import wait_until

pytestmark = pytest.mark.slow
TTL = "3"  # --announce-ttl: the crashed peer's record vanishes this fast


def test_a_standby_takes_sole_served_layers_and_keeps_them_served_through_a_crash(
    tiny_model_factory, local_swarm: LocalSwarm
) -> None:
    model_path: Path = tiny_model_factory("llama", 8)
    name = model_path.resolve().name
    local_swarm.start_dht()
    local_swarm.start_peer(model_path, "0:4", "--announce-ttl", TTL)
    sole = local_swarm.start_peer(model_path, "0:8", "--announce-ttl", TTL)  # the only server of 4:8
    standby = local_swarm.start_peer(model_path, None, "--standby", "--num-layers", "4", "--announce-ttl", TTL)
    node = SwarmNode(initial_peers=local_swarm.initial_peers, client_mode=True)
    try:
        wait_until(lambda: standby.peer_id in node.fetch_view(name).records, 10, "the standby's record")
        record = node.fetch_view(name).records[standby.peer_id]
        assert record.standby and record.layers == LayerRange(4, 8), record  # where one crash leaves layers dark
        assert "standby: chose layers 4:8" in standby.log_text()

        ids = torch.randint(3, 300, (1, 10), generator=torch.Generator().manual_seed(3))
        expected = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).generate(
            ids, max_new_tokens=20, do_sample=False)
        model = DistributedModel.from_pretrained(
            model_path, local_swarm.initial_peers, config=ClientConfig(step_timeout=3, max_retries=8, retry_backoff=0.3))
        uncovered: list[list[int]] = []

        class CrashAt:
            count = 0
            route_before: list[str] = []

            def put(self, value: torch.Tensor) -> None:
                CrashAt.count += 1
                if CrashAt.count == 6:
                    CrashAt.route_before = [h.peer_id for h in session.hops]
                    sole.kill()
                if CrashAt.count > 6:  # the view as a monitor reads it, while the dead record lingers and after
                    uncovered.append(node.fetch_view(name).uncovered_layers())

            def end(self) -> None:
                pass

        session = model.inference_session(max_length=30)
        try:
            with session:
                out = model.generate(ids, max_new_tokens=20, streamer=CrashAt(), session=session)
            assert torch.equal(out[:, -20:], expected[:, -20:])
            assert session.stats.failovers >= 1
            # Before the crash the fast peer carried 4:8 (the standby is a last resort); after it, the standby.
            assert standby.peer_id not in CrashAt.route_before
            assert [h.peer_id for h in session.hops if h.layers.end == 8] == [standby.peer_id]
        finally:
            model.close()

        def record_expired() -> bool:  # watching coverage until then, as a monitor would
            view = node.fetch_view(name)
            uncovered.append(view.uncovered_layers())
            return sole.peer_id not in view.records

        wait_until(record_expired, float(TTL) + 10, "the crashed peer's record to expire")
        assert uncovered and all(layers == [] for layers in uncovered)
    finally:
        node.shutdown()
