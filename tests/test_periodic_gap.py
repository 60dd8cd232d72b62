"""A periodic balance check that finds a layer with no server decides as a reaction: after its react delay, in
its place among the deciders (peer/balancer.py balance_loop), not at once."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

import peer.balancer as balancer
from swarm.types import LayerRange, PeerRecord, SwarmView
from tests.placements import scripted_placement


def record(peer_id: str, layers: LayerRange, throughput: float = 10.0) -> PeerRecord:
    return PeerRecord(peer_id, "m", layers, num_layers=8, updated=10.0, throughput=throughput)


# "me" and four others serve 4:8; in COVERED "sole" serves 0:4 too, as fast as the five together (no layer is
# thin: nothing for the watch to react to); in GAP it is gone and nobody serves 0:4.
OTHERS = {f"p{i}": record(f"p{i}", LayerRange(4, 8)) for i in range(4)}
GAP = SwarmView("m", 8, {"me": record("me", LayerRange(4, 8)), **OTHERS})
COVERED = SwarmView("m", 8, {**GAP.records, "sole": record("sole", LayerRange(0, 4), throughput=50.0)})


@pytest.mark.parametrize("loads_from_disk", [True, False])
def test_a_periodic_check_that_finds_a_gap_waits_its_react_delay_and_decides_on_a_fresh_view(
        tiny_model_factory, loads_from_disk: bool) -> None:
    """The watch's last read (ending its sleep before the check) shows 0:4 served; the periodic check's read shows
    the gap. A peer whose move would download its layers (a Hub model still prefetching, 5-7 s a layer) waits
    until every disk loader has decided (react_delay's `downloads`: 1 s here); one loading from disk goes first
    (no wait). Either way the move goes to the gap, decided on the view read after the wait."""
    model: Path = tiny_model_factory("llama", 8)
    reads: list[tuple[float, SwarmView]] = []
    moved: list[tuple[float, LayerRange, SwarmView | None]] = []
    decided = asyncio.Event()

    async def fetch_view() -> SwarmView:
        view = COVERED if not reads else GAP
        reads.append((asyncio.get_running_loop().time(), view))
        return view

    async def migrate(target: LayerRange, order: list[int] | None, decided_on: SwarmView | None,
                      confirm_s: float = 1.0) -> bool:
        moved.append((asyncio.get_running_loop().time(), target, decided_on))
        decided.set()
        return True

    placement = dataclasses.replace(
        scripted_placement(model, fetch_view, peer_id="me", layers=LayerRange(4, 8), migrate=migrate,
                           balance_period=0.2, watch_period=60.0),
        loads_from_disk=lambda: loads_from_disk)
    assert balancer.urgent_layers(COVERED) == []
    delay = balancer.react_delay(GAP, 4, downloads=not loads_from_disk)
    assert delay == (0.0 if loads_from_disk else 1.0)

    async def run() -> None:
        loop = balancer.balance_loop(placement)
        task = asyncio.create_task(loop)
        try:
            await asyncio.wait_for(decided.wait(), 10.0)
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(run())
    assert [view for _, view in reads[:3]] == [COVERED, GAP, GAP], "watch, periodic check, the read after the delay"
    (moved_at, target, decided_on), = moved
    assert target == LayerRange(0, 4) and decided_on is reads[2][1]
    periodic_read_at = reads[1][0]
    assert moved_at - periodic_read_at >= delay
    if not loads_from_disk:
        assert reads[2][0] - periodic_read_at >= delay - 0.01
