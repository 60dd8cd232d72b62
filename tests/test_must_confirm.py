"""must_confirm: which reactions skip the move's confirmation. Only peers that serve our layers and may decide
within MOVE_CONFIRM_S of us can leave them unseen at the same moment; of those the lowest id goes at once."""

from __future__ import annotations

from pathlib import Path

from peer.balancer import (
    MOVE_CONFIRM_S,
    REACT_DELAY_PER_LAYER_S,
    move_confirm_s,
    must_confirm,
    react_delay,
)
from swarm.types import LayerRange, PeerRecord, PeerState, SwarmView
from tests.placements import scripted_placement


def record(peer_id: str, start: int, end: int, *, standby: bool = False, moving_to: LayerRange | None = None,
           state: PeerState = PeerState.ONLINE) -> PeerRecord:
    return PeerRecord(peer_id, "m", LayerRange(start, end), state, 10.0, num_layers=32, standby=standby,
                      moving_to=moving_to)


def swarm(*records: PeerRecord, num_layers: int = 32) -> SwarmView:
    return SwarmView("m", num_layers, {r.peer_id: r for r in records})


# Every layer has a GPU server (the largest decide first); 4-layer "a" and "b" share 0:4 with 24-layer "big".
SHARED = swarm(record("big", 0, 24), record("a", 0, 4), record("b", 0, 4), record("c", 4, 8), record("d", 24, 32),
             record("e", 16, 24))


def test_two_peers_of_one_step_on_one_range_the_lower_id_goes_at_once() -> None:
    delay = react_delay(SHARED, 4)
    assert must_confirm(SHARED, "a", delay) is False  # "b" decides with it, but "a" goes first
    assert must_confirm(SHARED, "b", delay) is True  # ... and "b" confirms, and sees "a" leaving


def test_peers_of_other_steps_are_seen_as_a_confirmation_would_see_them() -> None:
    # "c" (4:8) shares its layers with "big" alone, whose step is (24 - 4) x 0.5 s away from its own.
    assert abs(react_delay(SHARED, 24) - react_delay(SHARED, 4)) >= MOVE_CONFIRM_S
    assert must_confirm(SHARED, "c", react_delay(SHARED, 4)) is False
    # ... and "big" (lower id than "c") goes first among the largest: nobody of its step shares its layers.
    assert must_confirm(SHARED, "big", react_delay(SHARED, 24)) is False


def test_every_reading_of_a_neighbours_step_counts() -> None:
    # A 4-layer "a0" beside an 8-layer "b8" (no gap: the largest, 8, first): b8 at once, a0 after
    # four steps, or five if it exposes a layer. A peer deciding 3.5 steps in may meet either reading of a0's.
    view = swarm(record("a0", 0, 4), record("b8", 0, 8), record("c8", 4, 12), record("d8", 8, 16), num_layers=16)
    assert react_delay(view, 4) == 4 * REACT_DELAY_PER_LAYER_S
    assert react_delay(view, 4, exposes=True) == 5 * REACT_DELAY_PER_LAYER_S
    assert must_confirm(view, "b8", 3.5 * REACT_DELAY_PER_LAYER_S) is True
    assert must_confirm(view, "b8", react_delay(view, 8)) is False  # a0's earliest, 4 steps, is 2 s after b8's


def test_standbys_movers_and_peers_elsewhere_do_not_count() -> None:
    view = swarm(record("a", 0, 4, standby=True), record("a1", 0, 4, moving_to=LayerRange(8, 12)),
                 record("a2", 4, 8), record("a3", 0, 4, state=PeerState.DRAINING), record("b", 0, 4))
    assert must_confirm(view, "b", react_delay(view, 4)) is False
    view = swarm(record("a", 0, 4), record("b", 2, 6))  # an overlap of two layers is a shared range
    assert must_confirm(view, "b", react_delay(view, 4)) is True


def test_a_peer_missing_from_the_view_confirms() -> None:
    assert must_confirm(SHARED, "zz", react_delay(SHARED, 4)) is True


def test_a_periodic_move_confirms_and_a_reaction_only_behind_one_that_goes_first(tiny_model_factory) -> None:
    model: Path = tiny_model_factory("llama", 8)

    async def fetch_view() -> SwarmView:
        return SHARED

    def wait(me: str, periodic: bool) -> float:
        layers = SHARED.records[me].layers
        return move_confirm_s(scripted_placement(model, fetch_view, peer_id=me, layers=layers), SHARED, periodic)

    assert wait("a", periodic=True) == wait("b", periodic=True) == MOVE_CONFIRM_S
    assert wait("a", periodic=False) == 0.0  # goes first
    assert wait("b", periodic=False) == MOVE_CONFIRM_S  # and sees "a" go
