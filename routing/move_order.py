"""In which order a moving GPU peer loads (and serves) its target: gaps first, then thin layers.

A peer that serves each layer as it arrives (peer/moves.py) serves one range growing by a layer at
either end (routing.standby.load_order picks the growing order of least weighted wait). For a GPU
peer the weight of a layer is what its arrival buys the swarm's max flow: a layer no GPU peer
serves weighs EXPOSED_GAP (3), since while one is left the max flow is 0 (clients wait, or crawl
through a standby) and one such layer outweighs any thin one; a thin layer weighs its shortfall
below the thin threshold as a share of it (0-1), since the thinnest bound the flow most; the rest
weigh 0. Simulated (benchmarks/simulate_swarm.py --serve-by-layer, docs/balancing.md, eleventh
session), the same weights as here.

Loaders take turns on a dark stretch: after a sole server's crash several small peers move onto its
layers at once, and each used to load its window from the same end, so most of them lit the same
few layers first and the stretch stayed dark (the swarm's max flow 0) until the slowest of them got
through. Each loader now announces the layers it still has to load, in order (the record's
`loading_order`, from its load start on: a move still confirming may step back, and arrives a
confirmation later than its order says), and a layer nobody serves weighs less for the next loader
as another brings it sooner (gap_weight): the next one starts where the others arrive last. Simulated at 1,000 peers
(docs/balancing.md, twenty-fifth session): 12% less time with some layer on standbys alone (2.12%
against 2.40% of the time, twelve seeds), the same moves. A loader that downloads (its record's `downloading`)
brings its layers seconds apart, so its order counts for nothing here (routing.downloads).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from routing.layer_view import staying_throughput
from routing.leaving import thin_threshold
from routing.standby import EXPOSED_GAP, load_order
from swarm.types import SERVING, LayerRange, SwarmView


def move_load_order(view: SwarmView, me: str, target: LayerRange) -> list[int]:
    """The load order of `target` for peer `me`, judged without it (see the module docstring)."""
    target = LayerRange(target.start, min(target.end, view.num_layers))
    served = [False] * view.num_layers  # by an ONLINE or DRAINING GPU peer other than me
    loading: list[Sequence[int]] = []  # what other GPU peers still load, each in its announced order
    for r in view.records.values():
        if r.peer_id == me or r.standby:
            continue
        if r.state in SERVING:
            for layer in range(r.layers.start, min(r.layers.end, view.num_layers)):
                served[layer] = True
        if r.loading_order and not r.downloading:  # a download's layers come seconds apart: nobody's
            loading.append(r.loading_order)
    arrivals = first_arrivals(loading)
    staying = staying_throughput(view, without=me)
    limit = thin_threshold(view)
    weight = [0.0] * view.num_layers
    for layer in range(target.start, target.end):
        if not served[layer]:
            weight[layer] = gap_weight(arrivals.get(layer), len(target))
        elif limit > 0 and staying[layer] < limit:
            weight[layer] = 1.0 - staying[layer] / limit
    return load_order(target, weight)


def first_arrivals(orders: Iterable[Sequence[int]]) -> dict[int, int]:
    """Per layer, how many layers the loader that brings it soonest loads before it: `orders` are the
    layers other peers still have to load, each in the order they will arrive (records'
    `loading_order`). Loaders load at about the same speed (a layer from disk), so steps stand in for
    seconds."""
    arrivals: dict[int, int] = {}
    for order in orders:
        for step, layer in enumerate(order):
            if step < arrivals.get(layer, step + 1):
                arrivals[layer] = step
    return arrivals


def gap_weight(step: int | None, width: int) -> float:
    """The load-order weight, for a loader of `width` layers, of a layer no GPU peer serves that another
    loader brings after `step` layers of its own (None: nobody loads it). EXPOSED_GAP when nobody does or
    when the other comes too late for it to matter (`step` >= `width`: this loader could bring it first
    wherever it lies in its window); less, in proportion, the sooner the other comes, and 0 when it is
    the other's first layer (this loader cannot bring it sooner). The stretch stays dark until its last
    layer arrives, so a loader's first layers are best spent where nobody else arrives soon."""
    if step is None:
        return EXPOSED_GAP
    return EXPOSED_GAP * min(1.0, step / max(1, width))
