"""benchmarks.sim_standby_round.StandbyScores: the simulator's standby round answers each standby as
routing.standby.standby_window does, without scoring every window for every standby."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.sim_standby_round import StandbyScores
from routing.standby import standby_window
from swarm.types import LayerRange


def reference(servers: list[int], guarded: list[int], k: int, current: LayerRange, hosted: list[LayerRange],
              pair_weight: float, idle_moves: bool) -> LayerRange | None:
    """What the simulator asked before: standby_window, the standby left out of its own layers' guards."""
    useless = [any(span.start <= layer < span.end for span in hosted) for layer in range(len(servers))]
    others = list(guarded)
    for layer in range(current.start, min(current.end, len(servers))):
        others[layer] -= not useless[layer]
    return standby_window(servers, others, k, current, useless, pair_weight, idle_moves)


@st.composite
def rounds(draw: st.DrawFn) -> tuple[list[int], list[int], int, LayerRange, list[LayerRange], float, bool]:
    total = draw(st.integers(4, 40))
    k = draw(st.integers(1, min(total, 9)))
    servers = draw(st.lists(st.integers(0, 3), min_size=total, max_size=total))
    start = draw(st.integers(0, total - k))
    current = LayerRange(start, start + k)
    guarded = draw(st.lists(st.integers(0, 2), min_size=total, max_size=total))
    hosted = []
    for _ in range(draw(st.integers(0, 2))):
        lo = draw(st.integers(0, total - 1))
        hosted.append(LayerRange(lo, draw(st.integers(lo + 1, total))))
    for layer in range(current.start, current.end):  # the standby guards its own layers but its host's
        if not any(span.start <= layer < span.end for span in hosted):
            guarded[layer] = max(guarded[layer], 1)
    return servers, guarded, k, current, hosted, draw(st.sampled_from([0.0, 0.25, 0.5])), draw(st.booleans())


@settings(max_examples=600, deadline=None)
@given(rounds())
def test_every_standby_gets_standby_windows_answer(case: tuple) -> None:
    servers, guarded, k, current, hosted, pair_weight, idle_moves = case
    scores = StandbyScores(servers, guarded, {k, 3}, pair_weight)
    assert scores.window_for(k, current, hosted, idle_moves) == reference(
        servers, guarded, k, current, hosted, pair_weight, idle_moves)


def test_a_standby_moves_only_for_a_gain_and_then_to_the_lowest_of_the_tied_best_windows() -> None:
    # 20 layers, all pairs, unguarded but for the standby's own 12:16; the round's best 4-layer windows
    # (four pairs: 1.0 at 0.25 each) lie everywhere: 1.0 more than where it is, never enough to move
    # from a place that guards something, enough from one that guards nothing, to the lowest start.
    servers, guarded = [2] * 20, [0] * 20
    for layer in range(12, 16):
        guarded[layer] = 1
    scores = StandbyScores(servers, guarded, {4}, 0.25)
    assert scores.window_for(4, LayerRange(12, 16), [], idle_moves=True) is None  # here 1.0: no gain
    servers[13] = 1  # now its own layer 13 is sole-served: without it, 12:16 weighs 1.75; staying wins
    scores = StandbyScores(servers, guarded, {4}, 0.25)
    assert scores.window_for(4, LayerRange(12, 16), []) is None
    assert scores.window_for(4, LayerRange(12, 16), [LayerRange(12, 20)]) == LayerRange(0, 4)  # its host's: useless
