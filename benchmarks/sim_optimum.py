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

Where the MILP is too big (public swarms: thousands of layers), `optimum_bracket` pins the
optimum between two cheap numbers: `capped_capacity_bound` above and, below, the best of two
one-pass placements (`ordered_placement`, `profile_placement`) after a local search of window
shifts (`climbed_placement`). docs/balancing.md has the proofs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from routing.balance import choose_window
from routing.flow import GreedyFeed, feed_greedily, max_flow_of
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


def capped_capacity_bound(peers: list[tuple[int, float]], num_layers: int) -> float:
    """The largest F with F * layers <= sum over peers of min(c_p, k_p * F): no placement carries more.

    Why it bounds every placement: a flow of F never needs more than F from one peer on one
    layer (the layer needs only F in all), so lowering any x[p][l] above F keeps it feasible;
    then peer p spends at most min(c_p, k_p F) and the L layers need F * L. Tighter than
    sum(c) / L wherever a peer is faster per layer (c_p / k_p) than the swarm's flow.
    Exact: g(F) = sum min(c, kF) - F L is concave and piecewise linear with breaks at c_p / k_p.
    """
    ks = [max(1, min(k, num_layers)) for k, _ in peers]
    rates = sorted((c / k, k, c) for k, (_, c) in zip(ks, peers) if c > 0)
    capped_sum = 0.0  # sum of c over peers whose rate is at most the segment's start: they spend all of c
    slope = float(sum(k for _, k, _ in rates) - num_layers)  # g's slope above 0: uncapped peers' k minus L
    start = 0.0
    for rate, k, c in rates:
        # On [start, rate] g(F) = capped_sum + slope * F; it falls below 0 where slope < 0.
        if slope < 0 and capped_sum + slope * rate < 0:
            return max(start, -capped_sum / slope)  # g(start) >= 0, so the root is in [start, rate)
        capped_sum += c
        slope -= k
        start = rate
    return capped_sum / num_layers  # past the last break every peer spends all of c: sum(c) / L


def profile_placement(peers: list[tuple[int, float]], num_layers: int) -> tuple[float, tuple[LayerRange, ...]]:
    """A placement whose windows end where the capacity so far reaches F per layer; (max flow, placement).

    Peers are laid along the model one after another, each window ending at the first layer
    e with F * e >= the (capped) capacity of the windows laid so far, its own included. Then
    the windows ending by any layer a hold at most F * a of capacity, and those starting at or
    after b about F * (L - b): Hall's condition for F on every interval of layers (the graph
    is convex, so intervals suffice), up to one peer's share at each boundary. F is the capped
    bound, a little below it, tried with peers in a few orders; the best max flow is kept.
    Capacity ascending wins on the simulator's GPU mix (98-99.6% of the capped bound at 2x).
    """
    bound = capped_capacity_bound(peers, num_layers)
    if bound <= 0:
        return 0.0, tuple(LayerRange(0, max(1, min(k, num_layers))) for k, _ in peers)
    index = range(len(peers))
    orders = (sorted(index, key=lambda p: peers[p][1]), sorted(index, key=lambda p: -peers[p][1]),
              sorted(index, key=lambda p: peers[p][0]), sorted(index, key=lambda p: -peers[p][0]))
    best: tuple[float, tuple[LayerRange, ...]] = (-1.0, ())
    for order in orders:
        for slack in PROFILE_SLACKS:
            placement = profile_layout(peers, num_layers, order, bound * (1 - slack))
            found = max_flow_of(list(zip(placement, (c for _, c in peers))), num_layers)
            best = max(best, (found, placement), key=lambda b: b[0])
    return best


def profile_layout(peers: list[tuple[int, float]], num_layers: int, order: list[int],
                   flow: float) -> tuple[LayerRange, ...]:
    """profile_placement's windows for one order of the peers and one aim `flow` (> 0)."""
    placement: list[LayerRange] = [LayerRange(0, 1)] * len(peers)
    laid = 0.0
    for p in order:
        k, capacity = max(1, min(peers[p][0], num_layers)), peers[p][1]
        laid += min(capacity, k * flow)
        end = min(num_layers, max(k, math.ceil(laid / flow - 1e-9)))
        placement[p] = LayerRange(end - k, end)
    return tuple(placement)


# How far below the capped bound profile_placement aims: rounding each end up to a whole layer
# overshoots a little, so aiming a bit lower sometimes does better. 4 orders x 4 slacks: 0.8 s at 1,000 peers.
PROFILE_SLACKS = (0.0, 0.003, 0.01, 0.03)


# climbed_placement: it aims CLIMB_STEP above the best max flow so far and shifts windows while that
# cuts the shortfall there; when nothing does, it aims a quarter as far, down to CLIMB_STEP_FLOOR.
# First one window at a time: CLIMB_SHIFTS per window, nearest first, then farther up the model (a
# window that ends with capacity nobody could take moves on to where it is needed), for the windows
# within CLIMB_REACH layers of the first layer short at the aim, nearest first, then every window that
# ended with capacity unused, most first. Then, where no single shift helps (a tight chain of windows
# of which each shift only moves the shortfall to the next), blocks: every window starting within w
# layers after the short layer one or two layers down, or every one ending within w before it one or
# two up, for w in CLIMB_BLOCKS. CLIMB_TRIES bounds the work: on the simulator's 1,000-peer swarms at
# 2x it stops after 5,000-10,000 shifts tried, 10-20 s (twice that where optimum_bracket climbs again;
# docs/balancing.md, twenty-seventh session);
# at 200 peers about a second.
CLIMB_STEP = 1e-3
CLIMB_STEP_FLOOR = 1e-5
CLIMB_SHIFTS = (1, -1, 2, -2, 3, -3, 4, -4, 6, -6, 8, -8, 12, 16)
CLIMB_REACH = 30
CLIMB_BLOCKS = (4, 8, 16, 32, 64, 128, 256)
CLIMB_TRIES = 10000


def climbed_placement(peers: list[tuple[int, float]], num_layers: int,
                      start: tuple[LayerRange, ...]) -> tuple[float, tuple[LayerRange, ...]]:
    """The best (max flow, placement) a local search from `start` finds: a placement, so no optimum is below it.

    The profile placement rounds every window's end to a whole layer, and what those roundings waste
    adds up: on the simulator's 1,000-peer swarms it sits 0.7-3.9 points of sum(c) / L under the
    capped bound. Glover's greedy at a flow just above the current one says exactly what is missing
    there (routing.flow.feed_greedily: the shortfall, the first short layer, the capacity each window
    ended with unused); a shift of one window, or of a block of them next to the short layer, that
    lowers that shortfall is kept (constants above).
    Deterministic: ties go to the lower index.
    """
    capacities = [c for _, c in peers]
    spans = list(start)

    def placement() -> list[tuple[LayerRange, float]]:
        return list(zip(spans, capacities))

    flow = max_flow_of(placement(), num_layers)
    best = (flow, tuple(spans))
    step, tries = CLIMB_STEP, 0
    while tries < CLIMB_TRIES and flow > 0:
        aim = flow * (1 + step)
        fed = feed_greedily(placement(), num_layers, aim)
        if fed.first_short is None:  # the aim is feasible: the max flow rose past it
            flow = max_flow_of(placement(), num_layers)
            best = max(best, (flow, tuple(spans)), key=lambda b: b[0])
            continue
        short = fed.first_short
        near = sorted((i for i, span in enumerate(spans) if span.start - CLIMB_REACH <= short < span.end + CLIMB_REACH),
                      key=lambda i: (abs((spans[i].start + spans[i].end) / 2 - short), i))
        seen = set(near)
        wasted = sorted((i for i, left in enumerate(fed.unused) if left > 0 and i not in seen),
                        key=lambda i: (-fed.unused[i], i))
        kept = False
        for i in near + wasted:
            span = spans[i]
            for shift in CLIMB_SHIFTS:
                if not 0 <= span.start + shift <= num_layers - len(span):
                    continue
                spans[i] = LayerRange(span.start + shift, span.end + shift)
                tries += 1
                if feed_greedily(placement(), num_layers, aim).shortfall < fed.shortfall - aim * 1e-9:
                    kept = True
                    break
                spans[i] = span
            if kept:
                break
        if not kept:
            tries += 4 * len(CLIMB_BLOCKS)
            kept = _shift_block(spans, capacities, num_layers, aim, fed)
        if kept:
            now = max_flow_of(placement(), num_layers)
            best = max(best, (now, tuple(spans)), key=lambda b: b[0])
            flow = max(flow, now)
        elif step > CLIMB_STEP_FLOOR:
            step /= 4
        else:
            break
    return best


def _shift_block(spans: list[LayerRange], capacities: list[float], num_layers: int, aim: float, fed: GreedyFeed) -> bool:
    """climbed_placement's block shifts (constants above): keep the first that cuts `fed`'s shortfall at `aim`."""
    short = fed.first_short
    assert short is not None
    for width in CLIMB_BLOCKS:
        for shift in (-1, -2, 1, 2):
            if shift < 0:  # the windows starting just after the short layer, down onto it
                block = [i for i, span in enumerate(spans) if short < span.start <= short + width]
            else:  # the windows ending just before it, up onto it
                block = [i for i, span in enumerate(spans) if short - width < span.end <= short]
            if not block or not all(0 <= spans[i].start + shift <= num_layers - len(spans[i]) for i in block):
                continue
            before = [spans[i] for i in block]
            for i in block:
                spans[i] = LayerRange(spans[i].start + shift, spans[i].end + shift)
            if feed_greedily(list(zip(spans, capacities)), num_layers, aim).shortfall < fed.shortfall - aim * 1e-9:
                return True
            for i, span in zip(block, before):
                spans[i] = span
    return False


@dataclass(frozen=True)
class Bracket:
    low: float  # max flow of the best placement found: the optimum is at least this
    high: float  # capped_capacity_bound: the optimum is at most this
    placement: tuple[LayerRange, ...]  # the placement that reaches `low`
    one_pass: float  # max flow of ordered_placement ...
    profile: float  # ... and of profile_placement; `low` is climbed_placement's from the better of the two


# optimum_bracket climbs a second time, from the profile layout of the peers in capacity order aimed at
# the capped bound, when the first climb leaves the bracket wider than this share of its high end.
# That layout is rarely the best profile before the climb but is the best start after it on the
# seeds tried (1,000 peers, seeds 15 and 19: 98.26 and 97.39% of sum(c) / L against 97.58 and 95.32%
# from the best profile; docs/balancing.md, twenty-seventh session); a second climb costs as much
# as the first, so only where the first left room.
CLIMB_AGAIN_WIDTH = 0.003


def optimum_bracket(peers: list[tuple[int, float]], num_layers: int) -> Bracket:
    """[low, high] around the best placement's max flow, for swarms too big for best_placement."""
    one_pass, profile = ordered_placement(peers, num_layers), profile_placement(peers, num_layers)
    high = capped_capacity_bound(peers, num_layers)
    start = max(one_pass, profile, key=lambda b: b[0])
    low = climbed_placement(peers, num_layers, start[1])
    if high > 0 and low[0] < high * (1 - CLIMB_AGAIN_WIDTH):
        ascending = sorted(range(len(peers)), key=lambda p: peers[p][1])
        again = climbed_placement(peers, num_layers, profile_layout(peers, num_layers, ascending, high))
        low = max(low, again, key=lambda b: b[0])
    return Bracket(low[0], max(low[0], high), low[1], one_pass[0], profile[0])
