"""The balancer's loops: a standby moves to more exposed layers, but never while it serves sessions; the watch
between balance checks says when it cannot read the swarm; a move that stepped back looks again within seconds."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

import peer.balancer as balancer
from peer.balancer import standby_loop
from swarm.types import LayerRange, PeerRecord, PeerState, SwarmView
from tests.placements import scripted_placement


def record(peer_id: str, layers: str, standby: bool = False) -> PeerRecord:
    start, end = map(int, layers.split(":"))
    return PeerRecord(peer_id, "m", LayerRange(start, end), num_layers=8, standby=standby, throughput=10.0)


# "a" and "b" serve 4:8 twice; nobody but "solo" serves 0:4, and no standby guards it: the
# standby "sb", on the doubly served 4:8, would guard more at 0:4.
VIEW = SwarmView("m", 8, {r.peer_id: r for r in (record("solo", "0:4"), record("a", "4:8"), record("b", "4:8"),
                                                  record("sb", "4:8", standby=True))})


def run_loop(model: Path, open_sessions: int) -> list[tuple[LayerRange, list[int]]]:
    """Run the loop for a few watch periods of 10 ms; the targets it migrated to, with their load orders."""
    moves: list[tuple[LayerRange, list[int]]] = []

    async def fetch_view() -> SwarmView:
        return VIEW

    async def migrate(target: LayerRange, order: list[int] | None, decided_on: SwarmView | None,
                      confirm_s: float = 1.0) -> bool:
        moves.append((target, order))
        return True

    placement = scripted_placement(model, fetch_view, peer_id="sb", layers=LayerRange(4, 8), migrate=migrate,
                                   open_sessions=open_sessions, standby=True, watch_period=0.01)

    async def bounded() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(standby_loop(placement), 0.3)

    asyncio.run(bounded())
    return moves


def test_an_idle_standby_moves_to_the_more_exposed_layers(tiny_model_factory) -> None:
    moves = run_loop(tiny_model_factory("llama", 8), open_sessions=0)
    assert moves and {target for target, _ in moves} == {LayerRange(0, 4)}
    assert all(sorted(order) == [0, 1, 2, 3] for _, order in moves)  # each layer served as it arrives


def test_a_standby_serving_sessions_stays_whatever_the_view_says(tiny_model_factory) -> None:
    # Clients use a standby only where nothing else serves: its sessions say "a" and "b" are gone,
    # even while their records are still listed.
    assert run_loop(tiny_model_factory("llama", 8), open_sessions=2) == []


def test_the_watch_says_once_that_reads_fail_and_still_reacts_when_they_work(
        tiny_model_factory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A DHT that stops answering is logged once per streak (not every read), and the first good read
    with an urgent layer still wakes the peer early."""
    monkeypatch.setattr(balancer, "REACT_DELAY_PER_LAYER_S", 0.0)
    model = tiny_model_factory("llama", 8)
    reads = 0
    # "solo" drains: 0:4 has no ONLINE server, an urgent layer for the GPU peer "a".
    draining = SwarmView("m", 8, {**VIEW.records, "solo": replace(record("solo", "0:4"), state=PeerState.DRAINING)})

    async def fetch_view() -> SwarmView:
        nonlocal reads
        reads += 1
        if reads <= 4:
            raise ConnectionError("DHT unreachable")
        return draining

    placement = scripted_placement(model, fetch_view, peer_id="a", layers=LayerRange(4, 8), watch_period=0.01)

    async def watch() -> SwarmView | None:
        loop = asyncio.get_running_loop()
        return await balancer._watch_until(placement, loop.time() + 5.0, [])

    with caplog.at_level("INFO", logger="peer.balancer"):
        woke = asyncio.run(watch())
    assert woke is draining and reads == 6  # 4 failed, 1 saw the urgent layers, 1 re-read after the react delay
    failures = [r for r in caplog.records if "reading the swarm's view failed" in r.getMessage()]
    assert len(failures) == 1 and "ConnectionError: DHT unreachable" in failures[0].getMessage()
    assert any("works again" in r.getMessage() for r in caplog.records)


def test_a_move_that_stepped_back_looks_again_within_seconds_not_at_the_next_read(
        tiny_model_factory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two peers woken by one crash notice decide together and both step back (each sees the other leave
    the same layers); each then looks again after a short random wait (STEP_BACK_RETRY_S), not at its next
    read of the view (here 5 min away), so one of them goes."""
    monkeypatch.setattr(balancer, "REACT_DELAY_PER_LAYER_S", 0.0)
    monkeypatch.setattr(balancer, "STEP_BACK_RETRY_S", (0.05, 0.1))
    model = tiny_model_factory("llama", 8)
    draining = SwarmView("m", 8, {**VIEW.records, "solo": replace(record("solo", "0:4"), state=PeerState.DRAINING)})
    attempts: list[LayerRange] = []

    async def fetch_view() -> SwarmView:
        return draining

    async def migrate(target: LayerRange, order: list[int] | None, decided_on: SwarmView | None,
                      confirm_s: float = 1.0) -> bool:
        attempts.append(target)
        return len(attempts) > 1  # the first attempt steps back

    placement = scripted_placement(model, fetch_view, peer_id="a", layers=LayerRange(4, 8), migrate=migrate,
                                   watch_period=300.0, balance_period=600.0)

    async def run() -> None:
        placement.wake.set()  # a crash notice
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(balancer.balance_loop(placement), 3.0)

    asyncio.run(run())
    assert attempts[:2] == [LayerRange(0, 4), LayerRange(0, 4)]
