"""routing.move_load_order: a moving GPU peer loads gaps first, then the thinnest layers."""

from __future__ import annotations

from routing import move_load_order
from swarm.types import LayerRange, PeerState
from tests.routing_helpers import rec, view


def prefixes_grow_one_range(order: list[int]) -> bool:
    return all(max(order[:i]) - min(order[:i]) + 1 == i for i in range(1, len(order) + 1))


def test_a_layer_no_gpu_peer_serves_comes_first() -> None:
    # Layer 6 has no server but the mover; 4:6 and 7:8 are served twice.
    swarm = view(8, rec("me", "4:8"), rec("a", "0:6"), rec("b", "0:6"), rec("c", "7:8"), rec("d", "7:8"))
    order = move_load_order(swarm, "me", LayerRange(4, 8))
    assert order[0] == 6 and sorted(order) == [4, 5, 6, 7] and prefixes_grow_one_range(order)


def test_the_thinnest_layers_come_before_well_served_ones() -> None:
    # Target 0:4 (mover elsewhere, at 4:8): layers 0:2 carry 10 tokens/s each, 2:4 only 1 (thin).
    swarm = view(8, rec("me", "4:8", 10.0), rec("a", "0:2", 10.0), rec("b", "2:4", 1.0), rec("c", "4:8", 10.0))
    order = move_load_order(swarm, "me", LayerRange(0, 4))
    assert set(order[:2]) == {2, 3} and prefixes_grow_one_range(order)


def test_a_drainer_alone_is_not_a_gap_but_counts_as_fully_thin() -> None:
    # Layer 1 is served only by a drainer: it still serves (no gap) but stays nowhere.
    swarm = view(4, rec("me", "2:4", 5.0), rec("a", "0:1", 5.0), rec("d", "1:2", 5.0, state=PeerState.DRAINING),
                 rec("x", "2:4", 5.0))
    order = move_load_order(swarm, "me", LayerRange(0, 2))
    assert order[0] == 1


def test_with_nothing_short_the_window_loads_in_order() -> None:
    swarm = view(4, rec("me", "0:2"), rec("a", "0:4"), rec("b", "0:4"))
    assert move_load_order(swarm, "me", LayerRange(2, 4)) == [2, 3]


def test_a_growing_peer_is_no_last_resort_but_a_mover_is() -> None:
    growing = rec("g", "5:7")
    growing = type(growing)(**{**growing.__dict__, "moving_to": LayerRange(4, 8)})
    mover = type(growing)(**{**growing.__dict__, "layers": LayerRange(0, 4)})
    assert growing.growing and not growing.last_resort
    assert not mover.growing and mover.last_resort
