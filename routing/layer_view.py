"""Per-layer arrays over a SwarmView: what balancing, drains and standbys count on each layer.

Where a record counts: balancing (layer_throughput, crossing_throughput, layer_counts, balanced_placement) counts
ONLINE and JOINING GPU peers, a mover at its target (COUNTED_STATES, _balanced_layers); the
servers a move or drain may rely on (layer_servers, staying_throughput) are ONLINE GPU peers on
the layers they keep (_staying_layers); guarded_layers marks where a standby serves or loads.
routing/balance.py's module docstring says why each counts where it does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from swarm.types import LayerRange, PeerRecord, PeerState, SwarmView

T = TypeVar("T", int, float)

COUNTED_STATES = (PeerState.ONLINE, PeerState.JOINING)  # where balancing counts a peer (a mover at its target)


def layer_throughput(view: SwarmView, *, without: str | None = None, min_layers: int = 0) -> list[float]:
    """Per-layer sum of the throughput of ONLINE and JOINING peers (movers at their target)
    holding at least `min_layers` layers (the tier a peer of that size balances against),
    optionally leaving one out."""
    return _per_layer(view, _balanced_layers, lambda r: r.throughput, 0.0, without, min_layers)


def crossing_throughput(view: SwarmView, *, without: str | None = None, min_layers: int = 0) -> list[float]:
    """Per layer boundary b (before layer b; 0 at b = 0), the throughput of the peers layer_throughput
    counts whose windows cross it (start < b < end): what a route may shift across b when a peer whose
    window ends or starts there crashes (routing.balance's staggered windows)."""
    return _per_layer(view, _balanced_layers, lambda r: r.throughput, 0.0, without, min_layers, inner=True)


def layer_servers(view: SwarmView, *, without: str | None = None) -> list[int]:
    """Per-layer count of ONLINE peers that will go on serving the layer: a moving peer counts
    only on the layers it keeps (it stops serving the rest at its swap)."""
    return _per_layer(view, _staying_layers, lambda r: 1, 0, without)


def staying_throughput(view: SwarmView, *, without: str | None = None) -> list[float]:
    """Per-layer throughput of the servers layer_servers counts (ONLINE, on the layers they keep)."""
    return _per_layer(view, _staying_layers, lambda r: r.throughput, 0.0, without)


def guarded_layers(view: SwarmView) -> list[bool]:
    """Layers a standby serves or is loading (ONLINE or JOINING, a mover at its target): a crash of
    their sole server leaves them slow, not dark, so they need no SOLE_DISCOUNT. A loading standby
    counts already, like a loading GPU peer in layer_counts: counted only once ONLINE, guards flip
    at every standby move and the GPU peers follow (measured: more moves, less flow,
    docs/balancing.md). (Machines aside: a standby keeps off its own machine's layers when it
    chooses, routing.standby.)"""
    out = [False] * view.num_layers
    for r in view.records.values():
        span = r.moving_to or r.layers
        if r.standby and r.state in COUNTED_STATES:
            for layer in range(span.start, min(span.end, view.num_layers)):
                out[layer] = True
    return out


def layer_counts(view: SwarmView, *, without: str | None = None) -> list[int]:
    """Per-layer count of ONLINE and JOINING peers, movers at their target (the servers
    balancing counts on)."""
    return _per_layer(view, _balanced_layers, lambda r: 1, 0, without)


def _per_layer(view: SwarmView, span_of: Callable[[PeerRecord], LayerRange | None],
               value: Callable[[PeerRecord], T], zero: T, without: str | None, min_layers: int = 0,
               inner: bool = False) -> list[T]:
    """Per layer, `zero` plus `value(r)` over the records r whose `span_of(r)` holds it (other than
    `without`, spans of at least `min_layers`); `inner`: per boundary b, over the spans that cross it
    (hold layers b - 1 and b)."""
    out = [zero] * view.num_layers
    for r in sorted_records(view):  # a fixed order: equal views give bit-identical float sums
        span = span_of(r)
        if span is not None and r.peer_id != without and len(span) >= min_layers:
            add = value(r)
            for layer in range(span.start + inner, min(span.end, view.num_layers)):
                out[layer] += add
    return out


def _balanced_layers(r: PeerRecord) -> LayerRange | None:
    """Where balancing counts a record: a moving peer at its target; DRAINING, OFFLINE and
    standby peers nowhere (a standby is a slow safety net, not capacity: see routing/standby.py)."""
    if r.state not in COUNTED_STATES or r.standby:
        return None
    return r.moving_to if r.moving_to is not None else r.layers


def _staying_layers(r: PeerRecord) -> LayerRange | None:
    """The layers an ONLINE peer will still serve: all of them, or those its move keeps (a
    standby none: a layer only it holds is as exposed as a gap to the moves and drains of others)."""
    if r.state is not PeerState.ONLINE or r.standby:
        return None
    if r.moving_to is None:
        return r.layers
    start, end = max(r.layers.start, r.moving_to.start), min(r.layers.end, r.moving_to.end)
    return LayerRange(start, end) if start < end else None


def balanced_placement(view: SwarmView, *, without: str | None = None) -> list[tuple[LayerRange, float]]:
    """(layers, layer-tokens/s) of every peer balancing counts (a mover at its target), for routing.flow."""
    return [(LayerRange(span.start, min(span.end, view.num_layers)), len(span) * max(r.throughput, 0.0))
            for r in sorted_records(view)
            if r.peer_id != without and (span := _balanced_layers(r)) is not None and span.start < view.num_layers]


def sorted_records(view: SwarmView) -> list[PeerRecord]:
    # Summation order fixed by peer id, so equal views give bit-identical floats.
    return [view.records[p] for p in sorted(view.records)]
