"""routing.downloads: a reaction counts a loader that downloads its layers, where its target holds a dark layer, only
on the layers it serves, so the disk loaders refill a dark stretch a downloading joiner took first (and the balancer
does); periodic checks count it as before; the record's field on the wire."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

import peer.balancer as balancer
from routing import balance_check, move_load_order
from routing.downloads import as_reactions_count
from swarm.types import LayerRange, PeerRecord, PeerState, SwarmView
from tests.placements import scripted_placement
from tests.routing_helpers import rec, view


def downloading_joiner(target: str, order: tuple[int, ...], throughput: float = 4.0) -> PeerRecord:
    """A GPU peer announced JOINING on `target`, its layers still to come downloading in `order`."""
    return replace(rec("joiner", target, throughput, state=PeerState.JOINING), loading_order=order, downloading=True)


# 4:8 lost its only server; a fast joiner that downloads took it a second before the reaction. "me" serves 0:4,
# which two others serve too, so it may leave.
SERVED = (rec("a", "0:4"), rec("b", "0:4"), rec("me", "0:4"), rec("c", "8:12"), rec("d", "8:12"))


def test_a_reaction_refills_a_dark_stretch_a_downloading_joiner_took() -> None:
    swarm = view(12, *SERVED, downloading_joiner("4:8", (7, 6, 5, 4)))
    decision = balance_check(swarm, "me", since_last_move_s=None, periodic=False)
    assert decision.target == LayerRange(4, 8)


def test_a_joiner_that_loads_from_disk_counts_at_its_target_as_before() -> None:
    swarm = view(12, *SERVED, replace(downloading_joiner("4:8", (7, 6, 5, 4)), downloading=False))
    assert balance_check(swarm, "me", since_last_move_s=None, periodic=False).target is None


def test_a_periodic_check_counts_a_downloader_at_its_target() -> None:
    swarm = view(12, *SERVED, downloading_joiner("4:8", (7, 6, 5, 4)))
    assert balance_check(swarm, "me", since_last_move_s=None, periodic=True).target is None


def test_a_reaction_counts_a_downloader_that_holds_dark_layers_only_where_it_serves() -> None:
    # Only "plain" serves besides the loaders: 0:4 and 8:10. Dark: 4:6 and 12:14.
    plain, plain_too = rec("plain", "0:4"), rec("plain_too", "8:10")
    growing = replace(rec("growing", "6:8", 2.0), moving_to=LayerRange(4, 8), loading_order=(5, 4), downloading=True)
    beside = replace(rec("beside", "0:2"), moving_to=LayerRange(4, 6), loading_order=(4, 5), downloading=True)
    shifting = replace(rec("shifting", "8:12"), moving_to=LayerRange(10, 14), loading_order=(12, 13), downloading=True)
    on_served = replace(downloading_joiner("0:4", (0, 1, 2, 3)), peer_id="on_served")  # nothing dark in its target
    standby = replace(downloading_joiner("4:8", (4, 5, 6, 7)), peer_id="standby", standby=True)
    mine = replace(downloading_joiner("4:8", (4, 5, 6, 7)), peer_id="me")
    swarm = view(14, plain, plain_too, growing, beside, shifting, on_served, standby, mine,
                 downloading_joiner("4:8", (7, 6, 5, 4)))
    assert swarm.uncovered_layers(standbys=False) == [4, 5, 12, 13]
    counted = as_reactions_count(swarm, "me").records
    assert counted["growing"] == replace(growing, moving_to=None, loading_order=None, downloading=False)
    assert counted["shifting"].layers == LayerRange(10, 12) and counted["shifting"].moving_to is None
    assert "joiner" not in counted and "beside" not in counted  # nothing of their targets served yet
    for peer_id, record in (("on_served", on_served), ("standby", standby), ("me", mine), ("plain", plain)):
        assert counted[peer_id] == record, peer_id


def test_the_next_loader_counts_a_downloaders_order_as_nobodys() -> None:
    # 2:6 is dark; a downloader loads it from 2 up, seconds a layer: this mover loads as if alone.
    swarm = view(8, rec("a", "0:2"), rec("b", "6:8"), rec("me", "0:2"), downloading_joiner("2:6", (2, 3, 4, 5)))
    assert move_load_order(swarm, "me", LayerRange(2, 6)) == [2, 3, 4, 5]
    from_disk = view(8, rec("a", "0:2"), rec("b", "6:8"), rec("me", "0:2"),
                     replace(downloading_joiner("2:6", (2, 3, 4, 5)), downloading=False))
    assert move_load_order(from_disk, "me", LayerRange(2, 6)) == [5, 4, 3, 2]


def test_downloading_survives_the_wire_and_must_be_a_bool() -> None:
    record = downloading_joiner("4:8", (7, 6, 5, 4))
    assert PeerRecord.from_dict(record.to_dict()) == record
    assert PeerRecord.from_dict({k: v for k, v in record.to_dict().items() if k != "downloading"}).downloading is False
    with pytest.raises(ValueError, match="downloading must be a bool"):
        PeerRecord.from_dict({**record.to_dict(), "downloading": 1})


@pytest.mark.parametrize("downloading", [True, False])
def test_the_balancer_reacts_onto_a_gap_a_downloading_joiner_took(tiny_model_factory, downloading: bool) -> None:
    """peer/balancer.py: "me" (4:8, with two others) finds 0:4 dark but for a fast joiner announced there. When the
    joiner downloads, the reaction moves onto 0:4, loading it as if nobody else did (the joiner's order counts as
    nobody's); when the joiner loads from disk, it counts there and nobody moves."""
    model: Path = tiny_model_factory("llama", 8)
    others = {f"p{i}": rec(f"p{i}", "4:8", 10.0) for i in range(2)}
    joiner = replace(downloading_joiner("0:4", (0, 1, 2, 3), throughput=50.0), downloading=downloading)
    swarm = SwarmView("m", 8, {"me": rec("me", "4:8", 10.0), **others, "joiner": joiner})
    moved: list[tuple[LayerRange, list[int] | None]] = []
    decided = asyncio.Event()

    async def fetch_view() -> SwarmView:
        return swarm

    async def migrate(target: LayerRange, order: list[int] | None, decided_on: SwarmView | None,
                      confirm_s: float = 1.0) -> bool:
        moved.append((target, order))
        decided.set()
        return True

    placement = scripted_placement(model, fetch_view, peer_id="me", layers=LayerRange(4, 8), migrate=migrate,
                                   balance_period=0.2, watch_period=0.2)

    async def run() -> None:
        task = asyncio.create_task(balancer.balance_loop(placement))
        try:
            await asyncio.wait_for(decided.wait(), 10.0 if downloading else 2.0)
        except TimeoutError:
            pass
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(run())
    assert moved == ([(LayerRange(0, 4), [0, 1, 2, 3])] if downloading else [])
