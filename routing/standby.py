"""Where a standby peer serves: the layers one abrupt departure would leave dark.

A standby (record `standby`: a slow safety net, usually a CPU in a machine's spare host memory)
is no capacity: balancing (routing/balance.py) counts it only as a guard. standby_window takes
per-layer lists so the simulator can keep them incrementally; standby_layers is the same on a
SwarmView, minding machines that fail together. load_order / standby_load_order: the order in
which a loading standby fetches and serves its window, so that the layers one crash from dark
are guarded after one layer's load, not the window's (docs/balancing.md, tenth session).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from routing.layer_view import COUNTED_STATES, layer_servers
from swarm.types import LayerRange, PeerState, SwarmView

# standby_window: a layer nobody serves (a crash already happened, or a draining sole server)
# counts 3x a sole-served one: it is dark now, the other only one departure from it.
EXPOSED_GAP = 3.0
# A standby moves only for at least max(1 layer, this share of its window) more exposed layers.
STANDBY_MARGIN = 0.25


def standby_window(
    servers: Sequence[int], standbys: Sequence[int], num_layers: int, current: LayerRange | None = None,
    useless: Sequence[bool] | None = None, pair_weight: float = 0.0, idle_moves: bool = False,
) -> LayerRange | None:
    """Where a standby holding `num_layers` layers should be, or None to stay on `current`.

    `servers`: per-layer count of ONLINE peers that stay there (layer_servers, standbys not
    counted); `standbys`: per-layer count of the other standbys (at their targets) that guard it.
    A layer is exposed when one abrupt departure would leave it dark: served by at most one peer
    and guarded by no other standby. The window scores EXPOSED_GAP per exposed layer nobody serves
    and 1 per exposed sole-served one, 0 on `useless` layers (its own machine serves or loads them:
    one crash would take both); the best score wins (ties: lowest start). A standby moves only when
    the best beats where it is by STANDBY_MARGIN: at least 1 layer and a quarter of its window, so
    it does not chase every passing change (a move reloads its layers); and never while it is the
    only server of one of its layers (leaving would darken it). With nothing exposed, a standby
    without a place takes the lowest start among the windows with the fewest standbys.
    """
    total = len(servers)
    if total == 0 or num_layers <= 0:
        raise ValueError(f"cannot place {num_layers} standby layers in a {total}-layer model")
    k = min(num_layers, total)
    if current is not None and any(servers[i] == 0 and not standbys[i] for i in range(current.start, min(current.end, total))):
        return None
    weight = exposure(servers, standbys, pair_weight)
    if useless is not None:
        weight = [0.0 if skip else value for value, skip in zip(weight, useless)]
    prefix = [0.0]
    for value in weight:
        prefix.append(prefix[-1] + value)
    scores = [prefix[s + k] - prefix[s] for s in range(total - k + 1)]
    best_score = max(scores)
    best = scores.index(best_score)  # ties: the lowest start
    if current is None:
        if best_score == 0:
            best = min(range(total - k + 1), key=lambda s: (sum(standbys[s : s + k]), s))
        return LayerRange(best, best + k)
    here = prefix[min(current.end, total)] - prefix[min(current.start, total)]
    margin = 1.0 if idle_moves and here == 0 else max(1.0, STANDBY_MARGIN * k)
    if best_score < here + margin:
        return None
    return LayerRange(best, best + k)


def load_order(window: LayerRange, weight: Sequence[float]) -> list[int]:
    """The order in which a standby loading `window` should fetch and serve its layers, given each
    layer's `weight` (exposure, judged without this standby).

    What it serves is one range that grows by a layer at either end at every step, as a record
    announces it, and of those orders this one has the least weighted time to arrival (the sum of
    weight x arrival step: the exposure left while it loads): a 24-layer standby loading from disk
    at 2 s per layer guards a sole-served layer in the middle of its window after 2 s, not 24.
    An interval DP over the window's O(k^2) sub-ranges; ties prefer growing to the right, then
    the lowest start. With nothing exposed: window order.
    """
    k = len(window)
    w = [float(weight[layer]) for layer in range(window.start, window.end)]
    if k == 0 or not any(w):
        return list(range(window.start, window.end))
    total = sum(w)
    prefix = [0.0]
    for value in w:
        prefix.append(prefix[-1] + value)
    # cost[(i, j)]: least exposure until [i, j) is loaded, loaded first; each step costs what is
    # still unloaded when it starts (the layer it brings included).
    cost = {(i, i + 1): (total, None) for i in range(k)}
    for size in range(2, k + 1):
        for i in range(k - size + 1):
            j = i + size
            right = cost[(i, j - 1)][0] + total - (prefix[j - 1] - prefix[i])  # last step: layer j - 1
            left = cost[(i + 1, j)][0] + total - (prefix[j] - prefix[i + 1])  # last step: layer i
            cost[(i, j)] = (right, "right") if right <= left else (left, "left")
    order = []
    i, j = 0, k
    while j - i > 1:
        if cost[(i, j)][1] == "right":
            order.append(j - 1)
            j -= 1
        else:
            order.append(i)
            i += 1
    order.append(i)
    return [window.start + index for index in reversed(order)]


def exposure(servers: Sequence[int], standbys: Sequence[int], pair_weight: float = 0.0) -> list[float]:
    """Per-layer score of standby_window: EXPOSED_GAP for a layer nobody serves, 1 for a
    sole-served one, `pair_weight` for an unguarded one two peers serve (one departure from
    sole-served), 0 when a standby guards it or more peers serve it."""
    return [layer_exposure(n, standby, pair_weight) for n, standby in zip(servers, standbys)]


def layer_exposure(servers: int, standbys: int, pair_weight: float = 0.0) -> float:
    """exposure of one layer that `servers` peers serve and `standbys` other standbys guard."""
    return 0.0 if standbys else EXPOSED_GAP if servers == 0 else 1.0 if servers == 1 else pair_weight if servers == 2 else 0.0


def standby_layers(view: SwarmView, me: str, num_layers: int, machines: Mapping[str, str] | None = None) -> LayerRange | None:
    """standby_window for standby peer `me` on a view: its first layers (when the view has no
    record of it yet), a better place, or None to stay.

    `machines`: peer id -> the machine it runs on, where known (peers on one machine fail
    together). A standby guards nothing for a peer of its own machine: those layers are useless
    to `me`, and another standby sitting on its own machine's layers does not count as their guard.
    """
    servers, standbys, useless, current = _standby_inputs(view, me, machines or {})
    return standby_window(servers, standbys, num_layers, current, useless)


def standby_load_order(view: SwarmView, me: str, target: LayerRange, machines: Mapping[str, str] | None = None) -> list[int]:
    """load_order for standby peer `me` loading `target` (a join or a move): the exposure of each
    layer judged without `me` (its own machine's layers count 0, as in standby_layers)."""
    servers, standbys, useless, _ = _standby_inputs(view, me, machines or {})
    weight = exposure(servers, standbys)
    if useless is not None:
        weight = [0.0 if skip else value for value, skip in zip(weight, useless)]
    return load_order(LayerRange(target.start, min(target.end, view.num_layers)), weight)


def _standby_inputs(view: SwarmView, me: str, machines: Mapping[str, str]
                    ) -> tuple[list[int], list[int], list[bool] | None, LayerRange | None]:
    """(layer_servers, other standbys guarding each layer, layers useless to `me`, its current place)."""
    n = view.num_layers
    held_by: list[set[str]] = [set() for _ in range(n)]  # machines serving or loading each layer
    for r in view.records.values():
        if r.standby or r.state is PeerState.OFFLINE or r.peer_id not in machines:
            continue
        for span in (span for span in (r.layers, r.moving_to) if span is not None):
            for layer in range(span.start, min(span.end, n)):
                held_by[layer].add(machines[r.peer_id])
    standbys = [0] * n
    for r in view.records.values():
        span = r.moving_to or r.layers
        if r.standby and r.peer_id != me and r.state in COUNTED_STATES:
            for layer in range(span.start, min(span.end, n)):
                standbys[layer] += machines.get(r.peer_id) not in held_by[layer]
    my_machine = machines.get(me)
    useless = [my_machine in holders for holders in held_by] if my_machine is not None else None
    mine = view.records.get(me)
    current = None if mine is None else (mine.moving_to or mine.layers)
    return layer_servers(view), standbys, useless, current
