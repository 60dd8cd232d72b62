"""The best placement's throughput: a mixed-integer program solved by HiGHS (scipy.optimize.milp).

Peers are (layers they can hold k_p, layer-tokens/s c_p). Variables: y[p][s] = 1 when peer p
serves the window [s, s + k_p); x[p][l] >= 0 its rate on layer l; F the swarm's tokens/s.

    maximise F
    sum_s y[p][s] = 1                          every peer serves one window
    x[p][l] <= c_p * sum_{s <= l < s+k_p} y    a peer works only on layers it holds
    sum_l x[p][l] <= c_p                        within its capacity
    sum_p x[p][l] >= F                          every layer carries the flow

For a fixed y this is routing.flow's max flow, so the program's optimum is the best
placement's max flow. HiGHS reports a proven upper bound (its dual bound) beside the best
placement it found, so a time limit still gives a bracket [best found, bound]. Bench-only:
scipy is imported here, never by the runtime packages.
"""

from __future__ import annotations

from dataclasses import dataclass

from routing.balance import choose_window
from routing.flow import max_flow_of
from swarm.types import LayerRange


@dataclass(frozen=True)
class Optimum:
    best: float  # tokens/s of the best placement found (a lower bound of the optimum)
    bound: float  # proven upper bound of the optimum (== best when solved to optimality)
    placement: tuple[LayerRange, ...]  # the best placement found, one range per peer
    optimal: bool


def best_placement(peers: list[tuple[int, float]], num_layers: int, time_limit_s: float = 20.0) -> Optimum:
    """Max-flow optimum over all placements of `peers` ((layers held, layer-tokens/s) each)."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import lil_matrix

    ks = [max(1, min(k, num_layers)) for k, _ in peers]
    caps = [c for _, c in peers]
    n, L = len(peers), num_layers
    y_index: list[list[int]] = []
    col = 0
    for k in ks:
        y_index.append(list(range(col, col + L - k + 1)))
        col += L - k + 1
    x0 = col  # x[p][l] at x0 + p * L + l
    f_col = x0 + n * L
    nvar = f_col + 1
    rows = n + n * L + n + L
    a = lil_matrix((rows, nvar))
    lo = np.full(rows, -np.inf)
    hi = np.full(rows, np.inf)
    r = 0
    for p in range(n):  # one window each
        for j in y_index[p]:
            a[r, j] = 1
        lo[r] = hi[r] = 1
        r += 1
    for p in range(n):  # x only on held layers
        for layer in range(L):
            a[r, x0 + p * L + layer] = 1
            for s, j in enumerate(y_index[p]):
                if s <= layer < s + ks[p]:
                    a[r, j] = -caps[p]
            hi[r] = 0
            r += 1
    for p in range(n):  # capacity
        a[r, x0 + p * L : x0 + (p + 1) * L] = 1
        hi[r] = caps[p]
        r += 1
    for layer in range(L):  # every layer carries F
        for p in range(n):
            a[r, x0 + p * L + layer] = 1
        a[r, f_col] = -1
        lo[r] = 0
        r += 1
    objective = np.zeros(nvar)
    objective[f_col] = -1
    integrality = np.zeros(nvar)
    integrality[:x0] = 1
    upper = np.full(nvar, np.inf)
    upper[:x0] = 1
    result = milp(
        objective,
        constraints=LinearConstraint(a.tocsr(), lo, hi),
        integrality=integrality,
        bounds=Bounds(np.zeros(nvar), upper),
        options={"time_limit": time_limit_s, "disp": False},
    )
    if result.x is None:
        raise RuntimeError(f"HiGHS found no placement: {result.message}")
    placement = []
    for p in range(n):
        s = max(range(len(y_index[p])), key=lambda i: result.x[y_index[p][i]])
        placement.append(LayerRange(s, s + ks[p]))
    # Re-evaluate the rounded placement exactly rather than trusting the solver's F.
    best = max_flow_of(list(zip(placement, caps)), L)
    bound = -float(result.mip_dual_bound) if result.mip_dual_bound is not None else -float(result.fun)
    return Optimum(best, max(bound, best), tuple(placement), bool(result.status == 0))


def ordered_placement(peers: list[tuple[int, float]], num_layers: int) -> tuple[float, tuple[LayerRange, ...]]:
    """A good placement built in one pass, its max flow a lower bound of the optimum (where a MILP is too big).

    Peers join one after another, each on the window of lowest throughput (routing's
    choose_window, throughput alone), largest memory first (ties: fastest first): the long
    windows lay a smooth base, the short ones patch its thin spots. Also tried: largest
    capacity first. Returns the better (max flow, placement). O(peers x layers).
    """
    best: tuple[float, tuple[LayerRange, ...]] = (-1.0, ())
    index = range(len(peers))
    for key in (lambda p: (-peers[p][0], -peers[p][1]), lambda p: -peers[p][1]):
        per_layer = [0.0] * num_layers
        placement: list[LayerRange | None] = [None] * len(peers)
        for p in sorted(index, key=key):
            k, capacity = peers[p]
            window = choose_window(per_layer, min(k, num_layers))
            for layer in range(window.start, window.end):
                per_layer[layer] += capacity / len(window)
            placement[p] = window
        spans = tuple(w for w in placement if w is not None)
        flow = max_flow_of(list(zip(spans, (c for _, c in peers))), num_layers)
        best = max(best, (flow, spans), key=lambda b: b[0])
    return best
