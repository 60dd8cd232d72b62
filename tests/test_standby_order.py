"""routing.standby.load_order: a loading standby serves one growing range, the exposed layers first."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from routing.standby import EXPOSED_GAP, load_order
from swarm.types import LayerRange


def exposure_left(order: list[int], weight: list[float]) -> float:
    """Sum of weight x arrival step (1-based): the exposure left while the standby loads."""
    return sum(weight[layer] * step for step, layer in enumerate(order, 1))


def growing_orders(window: LayerRange) -> list[list[int]]:
    """Every order that serves one range growing by a layer at either end (brute force)."""
    out = []
    for first in range(window.start, window.end):
        for sides in itertools.product("lr", repeat=len(window) - 1):
            lo, hi, order = first, first + 1, [first]
            for side in sides:
                if side == "l" and lo > window.start:
                    lo -= 1
                    order.append(lo)
                elif side == "r" and hi < window.end:
                    order.append(hi)
                    hi += 1
                else:
                    break
            if len(order) == len(window):
                out.append(order)
    return out


def test_nothing_exposed_loads_in_window_order() -> None:
    assert load_order(LayerRange(3, 7), [0.0] * 10) == [3, 4, 5, 6]


def test_a_sole_served_stretch_comes_first_and_a_gap_before_it() -> None:
    weight = [0.0] * 20
    weight[12] = weight[13] = 1.0  # sole-served, unguarded
    order = load_order(LayerRange(10, 16), weight)
    assert order[:2] in ([12, 13], [13, 12])
    weight[15] = EXPOSED_GAP  # nobody serves it: worth reaching first, through 14
    assert load_order(LayerRange(10, 16), weight)[:2] == [15, 14]


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 5), st.lists(st.sampled_from([0.0, 0.0, 1.0, EXPOSED_GAP]), min_size=1, max_size=7))
def test_the_order_grows_one_range_and_leaves_the_least_exposure(start: int, window_weights: list[float]) -> None:
    window = LayerRange(start, start + len(window_weights))
    weight = [0.0] * start + window_weights + [0.0] * 3
    order = load_order(window, weight)
    assert sorted(order) == list(range(window.start, window.end))
    for step in range(1, len(order) + 1):  # what it serves is one range at every step
        served = order[:step]
        assert max(served) - min(served) + 1 == step
    best = min(exposure_left(o, weight) for o in growing_orders(window))
    assert abs(exposure_left(order, weight) - best) < 1e-9


def test_on_a_view_the_order_is_judged_without_the_standby_and_skips_its_own_machine() -> None:
    from dataclasses import replace

    from routing.standby import standby_load_order
    from tests.routing_helpers import rec, view

    # 0:4 two servers, 4:8 only b (sole-served), 8:10 only c; standby s moving onto 2:8.
    swarm = [rec("a1", "0:4"), rec("a2", "0:4"), rec("b", "4:8"), rec("c", "8:10")]
    s = replace(rec("s", "2:8", 0.1), standby=True)
    v = view(10, *swarm, s)
    order = standby_load_order(v, "s", LayerRange(2, 8))
    assert sorted(order[:4]) == [4, 5, 6, 7]  # its own record does not hide the exposure it is about to guard
    # On b's machine, b's layers are no use to s: nothing in 2:8 is exposed for it.
    assert standby_load_order(v, "s", LayerRange(2, 8), {"b": "10.0.0.2", "s": "10.0.0.2"}) == list(range(2, 8))
