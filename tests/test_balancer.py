"""Peers place themselves where the swarm is weakest and move to close gaps (real processes)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
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


@contextmanager
def spread_swarm(local_swarm: LocalSwarm, model_path: Path, period: str, ttl: str, *extra: str
                 ) -> Iterator[tuple[SwarmNode, SwarmProcess, list[SwarmProcess]]]:
    """A fixed 0:10 peer and three self-placing 10-layer peers of a 30-layer model, started one after
    another (each sees the ones before it), with `--balance-period period --announce-ttl ttl` and
    `extra` options: (a DHT reader, the fixed peer, the movers)."""
    name = model_path.resolve().name
    local_swarm.start_dht()
    fixed = local_swarm.start_peer(model_path, "0:10", "--announce-ttl", ttl)
    node = SwarmNode(initial_peers=local_swarm.initial_peers, client_mode=True)
    try:
        movers = []
        for count in (2, 3, 4):
            movers.append(local_swarm.start_peer(model_path, None, "--num-layers", "10", "--move-mode", "in-place",
                                                 "--balance-period", period, "--announce-ttl", ttl, *extra))
            wait_until(lambda n=count: len(served_ranges(node, name)) == n, 20, f"{count} records", poll=0.5)
            if count == 3:  # three ranges of 10 layers: spread over every layer
                assert set(served_ranges(node, name).values()) == {LayerRange(0, 10), LayerRange(10, 20),
                                                                   LayerRange(20, 30)}
        assert served_ranges(node, name)[fixed.peer_id] == LayerRange(0, 10)
        assert node.fetch_view(name).uncovered_layers() == []
        yield node, fixed, movers
    finally:
        node.shutdown()


def generate_killing_a_sole_mover(model_path: Path, local_swarm: LocalSwarm, node: SwarmNode,
                                  movers: list[SwarmProcess]) -> tuple[SwarmProcess, LayerRange, float]:
    """Greedy generation of 24 tokens equal to transformers', while at token 8 a self-placing peer that
    is then the only server of some layer (so on every route) is killed: (the victim, its layers, the
    time.time() of the kill)."""
    name = model_path.resolve().name

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
                KillAt.at = time.time()

        def end(self) -> None:
            pass

    try:
        out = model.generate(ids, max_new_tokens=24, streamer=KillAt())
        assert torch.equal(out, expected)
        assert model.last_session.stats.failovers >= 1
    finally:
        model.close()
    return KillAt.victim, KillAt.gap, KillAt.at


def test_peers_spread_over_layers_then_close_a_gap_while_a_client_generates(
    tiny_model_factory, local_swarm: LocalSwarm
) -> None:
    model_path: Path = tiny_model_factory("llama", 30)
    name = model_path.resolve().name
    with spread_swarm(local_swarm, model_path, PERIOD, TTL) as (node, fixed, movers):
        victim, gap, _ = generate_killing_a_sole_mover(model_path, local_swarm, node, movers)

        # Someone moved into the gap within 2 x balance period (+ record expiry and loading).
        def gap_closed() -> bool:
            # And a mover's log says so: a record may list the whole new range (a periodic refresh) a
            # few ms before the move's end is logged.
            view = node.fetch_view(name)
            return (victim.peer_id not in view.records and view.uncovered_layers() == []
                    and any("now serving layers" in m.log_text() for m in movers if m is not victim))

        wait_until(gap_closed, 2 * float(PERIOD) * 1.25 + float(TTL) + 10, f"the layers of {gap} to be served again", poll=0.5)
        assert served_ranges(node, name)[fixed.peer_id] == LayerRange(0, 10), "a fixed --layers peer moved"
        assert node.fetch_view(name).uncovered_layers() == []
        # In place, as a GPU filled by its own layers moves (tests/test_drain.py moves beside).
        assert any("in place (--move-mode in-place)" in m.log_text() and "now serving layers" in m.log_text()
                   for m in movers if m is not victim), "nobody migrated in place"
        assert "moving from" not in fixed.log_text()


def test_a_crashed_sole_server_is_replaced_at_once_on_a_crash_notice(tiny_model_factory, local_swarm: LocalSwarm) -> None:
    """Records live 60 s (re-announced every 20 s, so a killed peer's stays listed 40-60 s), balance
    checks come every 10 min and the movers read the swarm between them only every 5 min, so
    only a crash notice can make one act within 30 s: the client that cannot dial the killed peer
    tells the peers at once (peer/crash_notices.py), a mover probes it, fails too, and takes its
    layers (peer/crash_watch.py). The generation still matches transformers."""
    model_path: Path = tiny_model_factory("llama", 30)
    with spread_swarm(local_swarm, model_path, "600", "60", "--watch-period", "300") as (node, _, movers):
        victim, gap, killed_at = generate_killing_a_sole_mover(model_path, local_swarm, node, movers)
    assert any(f"says peer {victim.peer_id} does not answer: probing it now" in m.log_text() for m in movers)
    assert any("reported unreachable and does not answer us either" in m.log_text() for m in movers)
    # When a mover began serving the gap, by its own log (same machine, same clock).
    took = [logged_at(line) - killed_at for m in movers if m is not victim for line in m.log_text().splitlines()
            if f"now serving layers {gap}" in line and logged_at(line) > killed_at]
    assert took and min(took) < 30, f"the gap {gap} was served again {took} s after the kill"


def logged_at(line: str) -> float:
    """The time.time() of a peer's log line ("2026-12-01 02:17:41,823 INFO ...", local time)."""
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
