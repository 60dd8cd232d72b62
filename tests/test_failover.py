"""Generation survives a peer that dies, refuses, or hangs mid-sentence, with identical output.

One twin swarm for the module (every layer range served twice, `--announce-ttl 4`): after each
case its victim is killed and replaced by a fresh peer of the same range, and the next case waits
until the DHT lists exactly the four live peers, so no stale record can stand in for the fault.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from client import ClientConfig, DistributedModel
from client.local_swarm import LocalSwarm, SwarmProcess
from client.session import InferenceSession
from tests.swarm_processes import new_test_swarm

pytestmark = pytest.mark.slow
NEW_TOKENS = 64
FAULT_AT = 20
RANGES = ("0:3", "0:3", "3:6", "3:6")  # any one peer can fail
# A dead peer's record is gone within 4 s. No drain: a SIGTERM'd twin leaves layers at half the
# mean throughput, thin by routing.THIN_SHARE's measure when its twin measured slower, and would
# wait peer/drain.py's THIN_GRACE_S for a replacement that fixed peers never send, past the end of
# the generation. This file tests the client's failover on the shutting_down frames a stopping
# peer sends (tests/test_drain.py tests the drain).
TTL = ("--announce-ttl", "4", "--drain-timeout", "0")


@dataclass
class TwinSwarm:
    swarm: LocalSwarm
    model: Path
    peers: dict[str, tuple[SwarmProcess, str]]  # peer id -> (process, its layers)
    victims: list[SwarmProcess] = field(default_factory=list)  # to be replaced before the next case

    def heal(self) -> None:
        """Kill each victim (dead, draining or paused) and start a peer of the same layers instead."""
        replacements = []
        for victim in self.victims:
            _, layers = self.peers.pop(victim.peer_id)
            victim.kill()
            replacements.append((self.swarm.start_peer(self.model, layers, *TTL, wait=False), layers))
        self.victims.clear()
        for peer, layers in replacements:
            self.swarm.wait_online(peer)
            self.peers[peer.peer_id] = (peer, layers)

    def wait_for_exact_records(self, model: DistributedModel, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            view = model.loop.run(model.swarm.view(fresh=True), timeout=30)
            if set(view.records) == set(self.peers) and len(view.online()) == len(RANGES):
                return
            assert time.monotonic() < deadline, f"DHT shows {sorted(view.records)}, live peers {sorted(self.peers)}"
            time.sleep(0.3)


@pytest.fixture(scope="module")
def twins(tiny_model_factory, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwinSwarm]:
    model = tiny_model_factory("gqa", 6)
    with new_test_swarm(tmp_path_factory.mktemp("failover")) as swarm:
        swarm.start_dht()
        peers = [swarm.start_peer(model, layers, *TTL, wait=False) for layers in RANGES]
        for peer in peers:
            swarm.wait_online(peer)
        yield TwinSwarm(swarm, model, {p.peer_id: (p, layers) for p, layers in zip(peers, RANGES)})


@pytest.fixture(scope="module")
def prompt_and_expected(twins: TwinSwarm) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, 300, (1, 12), generator=torch.Generator().manual_seed(11))
    reference = AutoModelForCausalLM.from_pretrained(twins.model, dtype=torch.float32).eval()
    return ids, reference.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)


class FaultAtToken:
    """A streamer that injects `fault` into the first hop's peer when token `at` arrives."""

    def __init__(self, session: InferenceSession, peers: dict[str, tuple[SwarmProcess, str]],
                 fault: Callable[[SwarmProcess], None], at: int = FAULT_AT):
        self.session, self.peers, self.fault, self.at = session, peers, fault, at
        self.tokens = 0
        self.victim: SwarmProcess | None = None
        self.failovers_before = -1

    def put(self, value: torch.Tensor) -> None:
        self.tokens += 1
        if self.tokens == self.at + 1:  # the first put is the prompt
            self.victim = self.peers[self.session.hops[0].peer_id][0]
            self.failovers_before = self.session.stats.failovers
            self.fault(self.victim)

    def end(self) -> None:
        pass


@pytest.mark.parametrize(
    "fault, push, step_timeout",
    [
        pytest.param(lambda p: p.kill(), False, 3.0, id="kill-9-relay"),
        pytest.param(lambda p: p.kill(), True, 3.0, id="kill-9-push"),
        pytest.param(lambda p: p.signal(signal.SIGTERM), True, 3.0, id="error-frame"),  # shutting_down frames
        pytest.param(lambda p: p.signal(signal.SIGSTOP), True, 3.0, id="hang"),  # short timeout: fails over on it
        # The default step timeout: the stall probe (client/stall.py) finds the stopped peer well before it.
        pytest.param(lambda p: p.signal(signal.SIGSTOP), True, 30.0, id="vanished-push"),
    ],
)
def test_generation_survives_a_failing_peer(twins: TwinSwarm, prompt_and_expected, fault, push: bool,
                                            step_timeout: float) -> None:
    ids, expected = prompt_and_expected
    config = ClientConfig(step_timeout=step_timeout, retry_backoff=0.1)
    model = DistributedModel.from_pretrained(twins.model, twins.swarm.initial_peers, config=config)
    injector = None
    try:
        twins.heal()
        twins.wait_for_exact_records(model)  # the previous case's victim has left the DHT
        with model.inference_session(max_length=128, push=push) as session:
            injector = FaultAtToken(session, twins.peers, fault)
            started = time.monotonic()
            out = model.generate(ids, max_new_tokens=NEW_TOKENS, session=session, streamer=injector)
            elapsed = time.monotonic() - started
            print(f"generation took {elapsed:.1f} s with the fault")
            if step_timeout >= 30:
                assert elapsed < step_timeout / 2, f"{elapsed:.1f} s: the silent hop was waited out"
            assert injector.victim is not None
            assert session.stats.failovers > injector.failovers_before, "the fault was never noticed"
            assert injector.victim.peer_id not in {h.peer_id for h in session.hops}
            print(f"faults=1 failovers={session.stats.failovers} retries={session.stats.retries}")
    finally:
        model.close()
        if injector is not None and injector.victim is not None:
            twins.victims.append(injector.victim)  # the next case starts with four healthy peers
    assert torch.equal(out, expected)


def two_full_peers(tiny_model_factory, local_swarm: LocalSwarm, *, seed: int, new_tokens: int
                   ) -> tuple[list[SwarmProcess], torch.Tensor, torch.Tensor, DistributedModel]:
    """Two online peers that each serve every layer of a tiny Llama, a prompt, transformers' greedy
    continuation of it, and a client (the caller closes it)."""
    model_path = tiny_model_factory("llama")
    local_swarm.start_dht()
    peers = [local_swarm.start_peer(model_path, "0:4", wait=False) for _ in range(2)]
    for peer in peers:
        local_swarm.wait_online(peer)
    ids = torch.randint(3, 300, (1, 6), generator=torch.Generator().manual_seed(seed))
    expected = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval().generate(
        ids, max_new_tokens=new_tokens, do_sample=False)
    return peers, ids, expected, DistributedModel.from_pretrained(model_path, local_swarm.initial_peers)


def test_a_killed_peers_record_is_dialled_once_not_once_per_session(tiny_model_factory, local_swarm: LocalSwarm) -> None:
    """Two peers serve every layer with the default TTL (30 s); the one announcing the higher
    throughput is killed, so its record outlives it and still looks like the fastest route. Four
    sessions in a row, each started after the previous one's time bans (1-2 s) ran out: only the
    first dials the corpse; the client then avoids it until it announces again (it never does).
    Every session's tokens equal transformers'."""
    peers, ids, expected, model = two_full_peers(tiny_model_factory, local_swarm, seed=5, new_tokens=4)
    try:
        view = model.loop.run(model.swarm.view(fresh=True), timeout=30)
        assert len(view.online()) == 2
        fastest = max(view.online(), key=lambda r: r.throughput).peer_id
        next(p for p in peers if p.peer_id == fastest).kill()
        retries = []
        for _ in range(4):
            time.sleep(2.5)  # longer than the first two time bans: only the unreachable mark holds
            with model.inference_session(max_length=16) as session:
                assert torch.equal(model.generate(ids, max_new_tokens=4, session=session), expected)
                retries.append(session.stats.retries)
        stale = model.loop.run(model.swarm.view(fresh=True), timeout=30)
    finally:
        model.close()
    assert fastest in stale.records, "the dead peer's record expired mid-test: nothing was tested"
    assert retries == [1, 0, 0, 0], f"dials of the dead peer per session: {retries}"


def assert_reported_alone(model: DistributedModel, victim: SwarmProcess, survivor: SwarmProcess) -> None:
    """Within 20 s the DHT's suspects list `victim` (the client reported it), never `survivor`."""
    deadline = time.monotonic() + 20
    while victim.peer_id not in (suspects := model.loop.run(
            model.swarm.node.fetch_suspects_async(model.model_name), timeout=30)):
        assert time.monotonic() < deadline, f"peer {victim.peer_id} was never reported"
        time.sleep(0.3)
    assert survivor.peer_id not in suspects


def test_a_peer_that_crashes_mid_generation_is_reported_as_a_suspect(tiny_model_factory, local_swarm: LocalSwarm) -> None:
    """Two peers serve every layer; the one carrying the session is killed at token 3. The client
    fails over to the other (same tokens as transformers), asks the dead one for its info beside the
    failover, and reports it on the DHT for the self-placing peers to probe (peer/crash_watch.py),
    although no route had to dial it again. The live peer is not reported."""
    peers, ids, expected, model = two_full_peers(tiny_model_factory, local_swarm, seed=7, new_tokens=8)
    try:
        with model.inference_session(max_length=32) as session:
            injector = FaultAtToken(session, {p.peer_id: (p, "0:4") for p in peers}, lambda p: p.kill(), at=3)
            assert torch.equal(model.generate(ids, max_new_tokens=8, session=session, streamer=injector), expected)
            assert session.stats.failovers >= 1
        victim = injector.victim
        assert_reported_alone(model, victim, next(p for p in peers if p is not victim))
    finally:
        model.close()


def test_a_vanished_peer_is_failed_over_and_reported_in_seconds(tiny_model_factory, local_swarm: LocalSwarm,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """Two peers serve every layer; the one carrying the session is stopped (SIGSTOP) at token 3: a
    host that vanished, whose streams stay open and never answer. With the default 30-s step timeout
    the client probes the silent hop, fails over when the probe goes unanswered (client/stall.py) and
    reports it as a suspect, all well inside one step timeout; the tokens equal transformers'. Before
    the stall probe this waited out the whole step timeout. The hop's decode steps were timed by then,
    so it is probed after less than ClientConfig.stall_probe_s (client/stall.py stall_wait)."""
    peers, ids, expected, model = two_full_peers(tiny_model_factory, local_swarm, seed=9, new_tokens=8)
    step_timeout = model.swarm.config.step_timeout
    assert step_timeout >= 30, "the default step timeout, which this test must beat by far"
    victim: SwarmProcess | None = None
    try:
        with model.inference_session(max_length=32) as session:
            injector = FaultAtToken(session, {p.peer_id: (p, "0:4") for p in peers},
                                    lambda p: p.signal(signal.SIGSTOP), at=3)
            started = time.monotonic()
            with caplog.at_level("INFO", logger="client.session"):
                out = model.generate(ids, max_new_tokens=8, session=session, streamer=injector)
            elapsed = time.monotonic() - started
            victim = injector.victim
            assert torch.equal(out, expected)
            assert session.stats.failovers >= 1
        assert victim is not None
        assert elapsed < step_timeout / 2, f"generation took {elapsed:.1f} s: the stalled hop was waited out"
        silences = [float(m.group(1)) for r in caplog.records
                    if (m := re.search(r"has not answered for ([0-9.]+) s", r.getMessage()))]
        assert silences and max(silences) < model.swarm.config.stall_probe_s, silences
        assert_reported_alone(model, victim, next(p for p in peers if p is not victim))
    finally:
        model.close()
        if victim is not None:
            victim.kill()  # a stopped process dies on SIGKILL; the fixture would too, later
