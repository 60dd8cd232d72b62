"""In which order a moving GPU peer loads (and serves) its target: gaps first, then thin layers.

A peer that serves each layer as it arrives (peer/moves.py) serves one range growing by a layer at
either end (routing.standby.load_order picks the growing order of least weighted wait). For a GPU
peer the weight of a layer is what its arrival buys the swarm's max flow: a layer no GPU peer
serves weighs EXPOSED_GAP (3), since while one is left the max flow is 0 (clients wait, or crawl
through a standby) and one such layer outweighs any thin one; a thin layer weighs its shortfall
below the thin threshold as a share of it (0-1), since the thinnest bound the flow most; the rest
weigh 0. Simulated (benchmarks/simulate_swarm.py --serve-by-layer, docs/balancing.md, eleventh
session), the same weights as here.
"""

from __future__ import annotations

from routing.layer_view import staying_throughput
from routing.leaving import thin_threshold
from routing.standby import EXPOSED_GAP, load_order
from swarm.types import SERVING, LayerRange, SwarmView


def move_load_order(view: SwarmView, me: str, target: LayerRange) -> list[int]:
    """The load order of `target` for peer `me`, judged without it (see the module docstring)."""
    target = LayerRange(target.start, min(target.end, view.num_layers))
    served = [False] * view.num_layers  # by an ONLINE or DRAINING GPU peer other than me
    for r in view.records.values():
        if r.peer_id != me and r.state in SERVING and not r.standby:
            for layer in range(r.layers.start, min(r.layers.end, view.num_layers)):
                served[layer] = True
    staying = staying_throughput(view, without=me)
    limit = thin_threshold(view)
    weight = [0.0] * view.num_layers
    for layer in range(target.start, target.end):
        if not served[layer]:
            weight[layer] = EXPOSED_GAP
        elif limit > 0 and staying[layer] < limit:
            weight[layer] = 1.0 - staying[layer] / limit
    return load_order(target, weight)
