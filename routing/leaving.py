"""May a peer leave its layers: the safety checks of moves, drains and the react order.

A move or a departure must leave no layer dark (covered_without, leaves_safely) and, where it can
be helped, none thin (thin_layers, thin_without: below THIN_SHARE of the mean layer throughput);
urgent_layers are those that make peers decide at once; a draining peer waits for peers that are
loading onto its layers (incoming) while any could still come (possible_takers); a swarm that is
down elsewhere lets a sole server shift into the gap (swarm_down, vacates_only_into, may_move);
a move steps back when a layer lost its last server after it was decided (gaps_opened_since);
exposes_on_leaving decides who reacts a step later (peer/balancer.py react_delay).
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.layer_view import (
    guarded_layers,
    layer_servers,
    layer_throughput,
    sorted_records,
    staying_throughput,
)
from swarm.types import LayerRange, PeerState, SwarmView

# A layer whose staying ONLINE throughput is below this share of the mean layer throughput is
# thin (thin_layers). The mean is the capacity bound: what every layer carries when the swarm
# is perfectly even. 1/2: a two-deep layer losing one of two equal servers falls to about half,
# which is what a departure does, while a settled swarm keeps most layers above it. Measured in
# the simulator (docs/balancing.md, 200 peers, 2x): 0.6 gave the same max flow at 1.1 moves per
# peer-hour on one seed (the budget is 1), 0.5 at 0.6-0.8.
THIN_SHARE = 0.5


def leaves_safely(current: LayerRange, others_online: Sequence[int], others_staying: Sequence[float] | None = None,
                  thin_limit: float = 0.0) -> bool:
    """May a peer stop serving `current` for a reload (plan_move's first two conditions)?"""
    for layer in range(current.start, current.end):
        if others_online[layer] <= 0:
            return False  # a layer only I serve: while I load my new range it would go dark
        if others_staying is not None and others_staying[layer] < thin_limit:
            return False  # a layer I would leave thin: its dip would last my whole reload
    return True


def vacates_only_into(current: LayerRange, target: LayerRange, others_online: Sequence[int]) -> bool:
    """Does `target` hold every layer of `current` that no other ONLINE peer serves?"""
    return all(layer in target for layer in range(current.start, current.end) if others_online[layer] <= 0)


def swarm_down(view: SwarmView, current: LayerRange) -> bool:
    """Has some layer outside `current` no ONLINE or DRAINING server, standbys included (no route exists)?"""
    return any(layer not in current for layer in view.uncovered_layers())


def urgent_layers(view: SwarmView) -> list[int]:
    """Layers that no ONLINE peer serves (uncovered, or served only by DRAINING peers) or that
    are thin (thin_layers).

    A peer that sees new ones should decide at once instead of at its next balance period: a
    draining peer waits for a replacement, a gap stops every client, and a thin layer caps the
    whole swarm's throughput until someone reloads there.
    """
    servers = layer_servers(view)
    thin = set(thin_layers(view))
    return [layer for layer, n in enumerate(servers) if n == 0 or layer in thin]


def thin_layers(view: SwarmView, *, without: str | None = None) -> list[int]:
    """Layers whose staying ONLINE servers (optionally without peer `without`) carry less than
    THIN_SHARE of the mean layer throughput of the peers balancing counts (the capacity bound)."""
    limit = thin_threshold(view, without=without)
    return [layer for layer, t in enumerate(staying_throughput(view, without=without)) if t < limit]


def thin_threshold(view: SwarmView, *, without: str | None = None) -> float:
    """THIN_SHARE of the mean layer throughput of the peers balancing counts (the capacity bound)."""
    counted = layer_throughput(view, without=without)
    return THIN_SHARE * sum(counted) / len(counted) if counted else 0.0


def thin_without(view: SwarmView, me: str) -> bool:
    """Would one of peer `me`'s layers be thin if it left now? A draining peer then waits for a
    replacement that is loading there (incoming), within its bounded wait."""
    record = view.records.get(me)
    if record is None:
        return False
    thin = set(thin_layers(view, without=me))
    return any(layer in thin for layer in range(record.layers.start, min(record.layers.end, view.num_layers)))


def incoming(view: SwarmView, me: str) -> list[str]:
    """Peers loading onto peer `me`'s layers: JOINING ones, or moving ones whose target overlaps them."""
    record = view.records.get(me)
    if record is None:
        return []
    out = []
    for r in sorted_records(view):
        target = r.moving_to if r.moving_to is not None else r.layers if r.state is PeerState.JOINING else None
        if (r.peer_id != me and not r.standby and target is not None
                and target.start < record.layers.end and record.layers.start < target.end):
            out.append(r.peer_id)
    return out


def covered_without(view: SwarmView, me: str, layers: LayerRange | None = None) -> bool:
    """Does every layer of peer `me` (its record's, or `layers`) have another ONLINE server that
    is not moving away? A draining peer may leave then; a peer that announced a move checks it
    once more (peer/server.py migrate), since another may have decided to leave at the same time.
    """
    if layers is None:
        record = view.records.get(me)
        if record is None:
            return True
        layers = record.layers
    servers = layer_servers(view, without=me)
    return all(servers[layer] > 0 for layer in range(layers.start, min(layers.end, view.num_layers)))


def exposes_on_leaving(view: SwarmView, me: str) -> bool:
    """Would peer `me` leaving its layers (a move or a departure) leave one of them to a single
    ONLINE server that no standby guards: one crash from dark? A peer reacting to urgent layers
    waits one step more then (peer/balancer.py react_delay), so that peers of its size whose
    leaving exposes nothing refill first, and it stays where it is needed if one of them did."""
    record = view.records.get(me)
    if record is None:
        return False
    servers = layer_servers(view, without=me)
    guarded = guarded_layers(view)
    return any(servers[layer] == 1 and not guarded[layer]
               for layer in range(record.layers.start, min(record.layers.end, view.num_layers)))


def may_move(view: SwarmView, me: str, current: LayerRange, target: LayerRange) -> bool:
    """May peer `me` go on with its announced move from `current` to `target`? Yes when its layers
    stay covered without it (covered_without), or when the swarm is down elsewhere and `target`
    takes every layer only it serves (plan_move's `swarm_down`)."""
    if covered_without(view, me, current):
        return True
    servers = layer_servers(view, without=me)
    return swarm_down(view, current) and vacates_only_into(current, target, servers)


def gaps_opened_since(decided_on: SwarmView, now: SwarmView, me: str, target: LayerRange) -> list[int]:
    """Layers outside `target` that no ONLINE peer but `me` serves in `now`, though one did in
    `decided_on`: a server crashed (the crash watch dropped it) between a move's decision and its
    confirmation. The move was weighed on a swarm that is gone; gaps come first, so it steps back
    and the peer's next read decides for them. Without this, a flow move decided on a view that
    still listed a crashed sole server went ahead while another peer, filling the gap, took a
    window of the move's old layers and left one layer dark (tests/test_balancer.py, seen in CI).
    """
    before = layer_servers(decided_on, without=me)
    after = layer_servers(now, without=me)
    return [layer for layer, (was, is_) in enumerate(zip(before, after))
            if is_ == 0 and was > 0 and layer not in target]


def possible_takers(view: SwarmView, me: str) -> list[str]:
    """Peers that could still take over `me`'s layers: JOINING and moving ones (they are
    choosing), and ONLINE ones whose own layers keep another ONLINE server besides them and
    `me` (plan_move would let them leave). Without any, a draining peer waits for nobody.
    """
    servers = layer_servers(view, without=me)
    out = []
    for r in sorted_records(view):
        if r.peer_id == me or r.standby:
            continue
        own = range(r.layers.start, min(r.layers.end, view.num_layers))
        if r.state is PeerState.JOINING or r.moving_to is not None or (
                r.state is PeerState.ONLINE and all(servers[i] > 1 for i in own)):
            out.append(r.peer_id)
    return out


