"""routing.move_load_order: a moving GPU peer loads gaps first (where other loaders arrive last), then the
thinnest layers."""

from __future__ import annotations

from dataclasses import replace

from routing import first_arrivals, gap_weight, move_load_order
from routing.standby import EXPOSED_GAP
from swarm.types import LayerRange, PeerRecord, PeerState
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


def loading(peer_id: str, target: str, order: tuple[int, ...]) -> PeerRecord:
    """A GPU peer announced JOINING on `target`, still to load `order` (a move in place or a join)."""
    return replace(rec(peer_id, target, state=PeerState.JOINING), loading_order=order)


def test_the_next_loader_of_a_dark_stretch_starts_where_the_other_arrives_last() -> None:
    # 2:6 is dark; another peer loads it from layer 2 up. Loading from 2 too (the rule before) would
    # light nothing sooner: this mover starts at 5 and meets the other in the middle.
    swarm = view(8, rec("a", "0:2"), rec("b", "6:8"), rec("me", "0:2"), loading("other", "2:6", (2, 3, 4, 5)))
    order = move_load_order(swarm, "me", LayerRange(2, 6))
    assert order == [5, 4, 3, 2]
    alone = view(8, rec("a", "0:2"), rec("b", "6:8"), rec("me", "0:2"))
    assert move_load_order(alone, "me", LayerRange(2, 6)) == [2, 3, 4, 5]
    # Each dark layer is lit after at most two loads instead of four.
    assert max(min(order.index(layer), (2, 3, 4, 5).index(layer)) for layer in range(2, 6)) + 1 == 2


def test_dark_layers_nobody_loads_come_before_those_another_loader_brings() -> None:
    # 2:8 is dark; the other loads 2:6 from 2 up, so 6 and 7 are this mover's alone to light.
    swarm = view(8, rec("a", "0:2"), rec("me", "0:2"), loading("other", "2:6", (2, 3, 4, 5)))
    order = move_load_order(swarm, "me", LayerRange(4, 8))
    assert set(order[:2]) == {6, 7} and prefixes_grow_one_range(order)


def test_a_standby_loading_is_no_loader_of_gpu_layers() -> None:
    standby = replace(loading("sb", "2:6", (2, 3, 4, 5)), standby=True)
    swarm = view(8, rec("a", "0:2"), rec("b", "6:8"), rec("me", "0:2"), standby)
    assert move_load_order(swarm, "me", LayerRange(2, 6)) == [2, 3, 4, 5]


def test_gap_weight_falls_the_sooner_another_loader_arrives() -> None:
    assert gap_weight(None, 4) == EXPOSED_GAP and gap_weight(0, 4) == 0.0
    assert gap_weight(4, 4) == gap_weight(9, 4) == EXPOSED_GAP
    assert [gap_weight(step, 4) for step in range(5)] == sorted(gap_weight(step, 4) for step in range(5))
    assert first_arrivals([(5, 4, 3), (3, 6)]) == {5: 0, 4: 1, 3: 0, 6: 1}


def test_a_loading_order_survives_the_wire_and_names_layers_of_the_target() -> None:
    joining = loading("j", "2:6", (5, 4))
    growing = replace(rec("g", "5:6"), moving_to=LayerRange(2, 6), loading_order=(4, 3, 2))
    for record in (joining, growing):
        assert PeerRecord.from_dict(record.to_dict()) == record
    assert "loading_order" not in rec("x", "0:2").to_dict()  # nothing loading: absent on the wire
