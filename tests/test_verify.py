"""A lying peer (hidden `--faulty` switch, test-only) is caught, avoided and reported; output stays exact."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from client import ClientConfig, DistributedModel
from client.local_swarm import LocalSwarm

pytestmark = pytest.mark.slow


def test_client_catches_and_routes_around_a_faulty_peer(tiny_model: Path, local_swarm: LocalSwarm) -> None:
    local_swarm.start_dht()
    # One peer serves everything (the cheapest route, one hop) but adds noise to its outputs;
    # two disjoint honest routes serve the same layers in halves, so verification has two opinions.
    starting = [local_swarm.start_peer(tiny_model, "0:4", "--faulty", "0.5", wait=False)]
    starting += [local_swarm.start_peer(tiny_model, r, wait=False) for r in ("0:2", "0:2", "2:4", "2:4")]
    for process in starting:
        local_swarm.wait_online(process)
    liar = starting[0].peer_id

    ids = torch.randint(3, 300, (1, 10), generator=torch.Generator().manual_seed(9))
    expected = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).generate(
        ids, max_new_tokens=10, do_sample=False)
    config = ClientConfig(verify=1.0, step_timeout=30)
    with DistributedModel.from_pretrained(tiny_model, local_swarm.initial_peers, config=config) as model:
        with model.inference_session(max_length=32) as session:
            out = model.generate(ids, max_new_tokens=10, session=session)
            assert session.stats.caught >= 1, "verification never caught the faulty peer"
            assert liar not in {h.peer_id for h in session.hops}
        assert liar in model.swarm.distrusted
        reports = model.loop.run(model.swarm.node.fetch_reports_async(model.model_name), timeout=30)
        assert liar in reports and reports[liar][0]["reporter"] == model.swarm.node.peer_id
        honest = set(p.peer_id for p in starting[1:])
        assert not honest & set(reports), "an honest peer was blamed"
    assert torch.equal(out, expected)
