"""Chaos: 12 concurrent generations through 5 SmolLM2 peers while peers are killed, restarted and paused.

Every generation must complete and equal its transformers reference; afterwards every live
peer's KV pool is back to empty and no process is left behind. Faults come from a fixed seed:
MAX_FAULTS of them, kills and pauses in turn, one every 1-2.5 s while the generations run (each
restart loads SmolLM2 again on the same 2 cores, so an unbounded monkey slows itself down).
"""

from __future__ import annotations

import random
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from client import ClientConfig, DistributedModel
from client.local_swarm import LocalSwarm, SwarmProcess

pytestmark = [pytest.mark.slow, pytest.mark.demo_model]
GENERATIONS = 12
NEW_TOKENS = 32
MAX_FAULTS = 6  # 3 kill -9 + restart, 3 pauses past the step timeout
PROMPT_TOKENS = 12
RANGES = ("0:15", "15:30", "0:15", "15:30", "0:30")  # every layer served at least twice
STEP_TIMEOUT = 6.0  # a paused peer is noticed after this long
TIME_LIMIT = 600.0  # the whole chaos phase; the test fails rather than hang


def reference_outputs(model_path: Path, prompts: torch.Tensor) -> torch.Tensor:
    reference = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    reference.generation_config.eos_token_id = None  # all NEW_TOKENS, like the swarm below
    return reference.generate(prompts, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)


class ChaosMonkey(threading.Thread):
    """Every second or two, MAX_FAULTS times: kill -9 and restart, or pause past the step timeout, a random peer."""

    def __init__(self, swarm: LocalSwarm, model_path: Path, peers: list[SwarmProcess], seed: int) -> None:
        super().__init__(daemon=True)
        self.swarm, self.model_path, self.peers = swarm, model_path, peers
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.faults: list[str] = []
        self.restarting: list[SwarmProcess] = []

    def run(self) -> None:
        kinds = ["kill", "pause"]
        while len(self.faults) < MAX_FAULTS and not self.stop.wait(self.rng.uniform(1.0, 2.5)):
            index = self.rng.randrange(len(self.peers))
            victim, kind = self.peers[index], kinds[len(self.faults) % 2]  # alternate: both kinds happen
            if kind == "kill":
                self.faults.append(f"kill -9 + restart {RANGES[index]}")
                victim.kill()
                # The replacement loads in the background; the monkey keeps going meanwhile.
                self.peers[index] = self.swarm.start_peer(self.model_path, RANGES[index], wait=False)
                self.restarting.append(self.peers[index])
            else:
                self.faults.append(f"pause {RANGES[index]}")
                victim.signal(signal.SIGSTOP)
                self.stop.wait(STEP_TIMEOUT + 2)
                victim.signal(signal.SIGCONT)


async def pool_state(model: DistributedModel, peer_id: str) -> tuple[int, int, int]:
    reply = await model.swarm.peer_info(peer_id)
    record, stats = reply["record"], reply["stats"]
    return record["free_pages"], record["total_pages"], stats["sessions"]


def test_generations_survive_chaos(demo_model: Path, local_swarm: LocalSwarm) -> None:
    prompts = torch.randint(100, 20000, (GENERATIONS, PROMPT_TOKENS), generator=torch.Generator().manual_seed(0))
    local_swarm.start_dht()
    peers = [local_swarm.start_peer(demo_model, r, "--announce-ttl", "10", wait=False) for r in RANGES]
    expected = reference_outputs(demo_model, prompts)  # while the peers load
    for peer in peers:
        local_swarm.wait_online(peer)
    config = ClientConfig(step_timeout=STEP_TIMEOUT, max_retries=10, retry_backoff=0.2)
    outputs: dict[int, torch.Tensor] = {}
    errors: dict[int, BaseException] = {}
    stats = []
    with DistributedModel.from_pretrained(demo_model, local_swarm.initial_peers, config=config) as model:

        def generate(i: int) -> None:
            try:
                with model.inference_session(max_length=PROMPT_TOKENS + NEW_TOKENS + 1) as session:
                    outputs[i] = model.generate(prompts[i : i + 1], max_new_tokens=NEW_TOKENS, session=session,
                                                eos_token_id=[])
                    stats.append(session.stats)
            except BaseException as e:  # reported below with the generation's index
                errors[i] = e

        monkey = ChaosMonkey(local_swarm, demo_model, peers, seed=1234)
        workers = [threading.Thread(target=generate, args=(i,), daemon=True) for i in range(GENERATIONS)]
        started = time.monotonic()
        monkey.start()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=max(1.0, TIME_LIMIT - (time.monotonic() - started)))
        monkey.stop.set()
        monkey.join(timeout=60)
        for restarted in monkey.restarting:
            if restarted in monkey.peers:  # not killed again meanwhile
                local_swarm.wait_online(restarted)
        hung = [i for i, w in enumerate(workers) if w.is_alive()]
        print(f"chaos: faults={len(monkey.faults)} ({', '.join(monkey.faults)}); "
              f"failovers={sum(s.failovers for s in stats)} retries={sum(s.retries for s in stats)}; "
              f"{time.monotonic() - started:.0f} s")
        assert not hung, f"generations {hung} did not finish within {TIME_LIMIT} s"
        assert not errors, f"generations failed: {errors}"
        assert monkey.faults, "the chaos monkey injected no fault"
        for i in range(GENERATIONS):
            assert torch.equal(outputs[i], expected[i : i + 1]), f"generation {i} differs from its reference"

        # Every live peer's pool drains back to empty once the clients are gone (bounded wait).
        deadline = time.monotonic() + 30
        for peer in monkey.peers:
            if not peer.peer_id:
                continue
            while True:
                free, total, sessions = model.loop.run(pool_state(model, peer.peer_id), timeout=30)
                if (free == total and sessions == 0) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert free == total and sessions == 0, f"peer {peer.peer_id}: {free}/{total} pages free, {sessions} sessions"
