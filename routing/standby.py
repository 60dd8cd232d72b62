"""Where a standby peer serves: the layers one abrupt departure would leave dark.

A standby (record `standby`: a slow safety net, usually a CPU in a machine's spare host memory)
is no capacity: balancing (routing/balance.py) counts it only as a guard. standby_window takes
per-layer lists so the simulator can keep them incrementally; standby_layers is the same on a
SwarmView, minding machines that fail together.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from routing.balance import COUNTED_STATES, layer_servers
from swarm.types import LayerRange, PeerState, SwarmView

# standby_window: a layer nobody serves (a crash already happened, or a draining sole server)
# counts 3x a sole-served one: it is dark now, the other only one departure from it.
EXPOSED_GAP = 3.0
# A standby moves only for at least max(1 layer, this share of its window) more exposed layers.
STANDBY_MARGIN = 0.25


def standby_window(
    servers: Sequence[int], standbys: Sequence[int], num_layers: int, current: LayerRange | None = None,
    useless: Sequence[bool] | None = None,
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
    weight = exposure(servers, standbys)
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
    if best_score < here + max(1.0, STANDBY_MARGIN * k):
        return None
    return LayerRange(best, best + k)


def exposure(servers: Sequence[int], standbys: Sequence[int]) -> list[float]:
    """Per-layer score of standby_window: EXPOSED_GAP for a layer nobody serves, 1 for a
    sole-served one, 0 when a standby guards it or two peers serve it."""
    return [0.0 if standby else EXPOSED_GAP if n == 0 else 1.0 if n == 1 else 0.0
            for n, standby in zip(servers, standbys)]


def standby_layers(view: SwarmView, me: str, num_layers: int, machines: Mapping[str, str] | None = None) -> LayerRange | None:
    """standby_window for standby peer `me` on a view: its first layers (when the view has no
    record of it yet), a better place, or None to stay.

    `machines`: peer id -> the machine it runs on, where known (peers on one machine fail
    together). A standby guards nothing for a peer of its own machine: those layers are useless
    to `me`, and another standby sitting on its own machine's layers does not count as their guard.
    """
    machines = machines or {}
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
    return standby_window(layer_servers(view), standbys, num_layers, current, useless)
