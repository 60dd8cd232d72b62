"""Generation survives a peer that dies, refuses, or hangs mid-sentence, with identical output."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from client import ClientConfig, DistributedModel
from client.local_swarm import LocalSwarm, SwarmProcess
from client.session import InferenceSession

pytestmark = pytest.mark.slow
NEW_TOKENS = 64
FAULT_AT = 20


def start_twin_swarm(swarm: LocalSwarm, model: Path) -> dict[str, SwarmProcess]:
    """4 peers: every layer range is served twice, so any one peer can fail."""
    swarm.start_dht()
    peers = [swarm.start_peer(model, layers, wait=False) for layers in ("0:3", "0:3", "3:6", "3:6")]
    for peer in peers:
        swarm.wait_online(peer)
    return {p.peer_id: p for p in peers}


class FaultAtToken:
    """A streamer that injects `fault` into the first hop's peer when token FAULT_AT arrives."""

    def __init__(self, session: InferenceSession, peers: dict[str, SwarmProcess], fault: Callable[[SwarmProcess], None]):
        self.session, self.peers, self.fault = session, peers, fault
        self.tokens = 0
        self.victim: SwarmProcess | None = None

    def put(self, value: torch.Tensor) -> None:
        self.tokens += 1
        if self.tokens == FAULT_AT + 1:  # the first put is the prompt
            self.victim = self.peers[self.session.hops[0].peer_id]
            self.fault(self.victim)

    def end(self) -> None:
        pass


@pytest.mark.parametrize(
    "fault, push",
    [
        pytest.param(lambda p: p.kill(), False, id="kill-9-relay"),
        pytest.param(lambda p: p.kill(), True, id="kill-9-push"),
        pytest.param(lambda p: p.signal(signal.SIGTERM), True, id="error-frame"),  # shutting_down frames
        pytest.param(lambda p: p.signal(signal.SIGSTOP), True, id="hang"),
    ],
)
def test_generation_survives_a_failing_peer(tiny_model_factory, local_swarm: LocalSwarm, fault, push: bool) -> None:
    model_path = tiny_model_factory("gqa", 6)
    peers = start_twin_swarm(local_swarm, model_path)
    ids = torch.randint(3, 300, (1, 12), generator=torch.Generator().manual_seed(11))
    reference = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    expected = reference.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
    config = ClientConfig(step_timeout=3.0, retry_backoff=0.1)  # short timeout: "hang" fails over fast
    model = DistributedModel.from_pretrained(model_path, local_swarm.initial_peers, config=config)
    try:
        with model.inference_session(max_length=128, push=push) as session:
            injector = FaultAtToken(session, peers, fault)
            out = model.generate(ids, max_new_tokens=NEW_TOKENS, session=session, streamer=injector)
            assert injector.victim is not None
            assert session.stats.failovers >= 1, "the fault was never noticed"
            assert injector.victim.peer_id not in {h.peer_id for h in session.hops}
            print(f"faults=1 failovers={session.stats.failovers} retries={session.stats.retries}")
    finally:
        model.close()
    assert torch.equal(out, expected)
