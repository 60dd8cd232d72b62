"""Which layers a peer should serve: choose_layers on join, should_move while running.

The measure of a swarm is its per-layer throughput: the sum of the announced throughputs
(tokens/s) of the peers holding each layer. A generation step has to pass every layer,
so the swarm is as fast as its thinnest layer, the bottleneck; an uncovered layer
(throughput 0) stops every client. Both decisions aim at the bottleneck.

JOINING peers count towards throughput here (but not in routing): a joining peer has
already chosen its layers and is loading them, and ignoring it would send the next peers
to join or move to the same thin spot while it loads (herding). A moving peer (record
`moving_to`) counts at its target for the same reason, while it still serves its old layers.
Only ONLINE peers count as servers when checking that a move uncovers nothing, since a
loading peer serves no one, and a moving one only on the layers it keeps (layer_servers).
DRAINING peers count nowhere here: they are leaving, so their layers look as thin as they
will be, and peers that can take them over do so while the drainer still serves.

Tiers: a peer weighs only the peers that hold at least as many layers as it does (the
`min_layers` of layer_throughput). Whatever order peers arrive in, this rebuilds the
placement of a one-pass "largest first" layout (benchmarks/sim_optimum.ordered_placement):
the largest peers lay a smooth base among themselves, and each smaller size patches the thin
spots of the sizes above it; a layer that only smaller peers hold looks empty to a large one.
A small peer arriving later never pushes a large one around. Gaps and redundancy are judged
on every peer (layer_counts). Measured in the simulator (docs/balancing.md, 2x, steady
state, paired, three seeds): max flow 34-44% -> 36-62% of the capacity bound at 1,000 peers,
43-55% -> 57-77% at 200.

Redundancy counts too: given per-layer server counts, a layer with a single server counts
at SOLE_DISCOUNT of its throughput (its *strength*). Such a layer is one abrupt departure
from a gap that lasts a whole weight load, while a second server turns that departure into
a repair with no gap; so a second server is worth more there than speed alone says. Unless
a standby guards the layer (guarded_layers): then a crash leaves it slow, not dark, and the
redundancy is already there, so it counts at its full throughput.

Thin layers: a departure rarely opens a gap but often halves a layer's throughput, and the
swarm's max flow with it, until someone reloads there. A layer whose staying servers carry
less than THIN_SHARE of the mean layer throughput is urgent like a gap (urgent_layers): peers
decide at once instead of at their next balance period, a draining peer stays while a
replacement loads (thin_without, incoming), and a peer does not move away from layers it would
leave thin (should_move): its reload would dip them as a departure does.

Standbys (record `standby`: a slow safety net, usually a CPU) count in the above only as guards
(guarded_layers): they are no capacity, and no server a move or drain may count on.
routing/standby.py places them on the layers one abrupt departure would leave dark (exposed),
minding machines that fail together.

The array-level functions (choose_window, plan_move) take per-layer lists so a
simulator can keep them incrementally; choose_layers / should_move are the
same on a SwarmView.
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.flow import bottleneck_layer
from swarm.types import LayerRange, PeerRecord, PeerState, SwarmView

# Petals' default balance_quality. A move must make the bottleneck of the layers it touches
# at least 1/0.75 = 1.33x what it is now. Every move costs minutes of reloading weights
# and breaks the sessions on the old range, so small gains are not worth it; and a margin
# this wide stops two peers from swapping back and forth on measurement noise.
DEFAULT_QUALITY = 0.75
# A layer served by one peer counts at this share of its throughput. 1/2: a second server of
# the same speed then quadruples the layer's strength (2x throughput, no discount), so peers
# fill sole-served layers first unless the doubly served ones are more than 2x slower.
# Measured in the simulator (docs/balancing.md, 500 peers at 2x): coverage 94.5% -> 98.6% for
# max flow 58% -> 43% of the bound; a strict "two servers first" order got 99.7% at 20%.
SOLE_DISCOUNT = 0.5
# A layer whose staying ONLINE throughput is below this share of the mean layer throughput is
# thin (thin_layers). The mean is the capacity bound: what every layer carries when the swarm
# is perfectly even. 1/2: a two-deep layer losing one of two equal servers falls to about half,
# which is what a departure does, while a settled swarm keeps most layers above it. Measured in
# the simulator (docs/balancing.md, 200 peers, 2x): 0.6 gave the same max flow at 1.1 moves per
# peer-hour on one seed (the budget is 1), 0.5 at 0.6-0.8.
THIN_SHARE = 0.5

COUNTED_STATES = (PeerState.ONLINE, PeerState.JOINING)  # where balancing counts a peer (a mover at its target)
# Throughput standing in for "served, but only by peers outside my tier" when real gaps are
# ranked: above 0 (not a gap), below any real throughput.
_NOT_A_GAP = 1e-12


def layer_throughput(view: SwarmView, *, without: str | None = None, min_layers: int = 0) -> list[float]:
    """Per-layer sum of the throughput of ONLINE and JOINING peers (movers at their target)
    holding at least `min_layers` layers (the tier a peer of that size balances against),
    optionally leaving one out."""
    out = [0.0] * view.num_layers
    for r in _sorted_records(view):
        span = _balanced_layers(r)
        if span is not None and r.peer_id != without and len(span) >= min_layers:
            for layer in range(span.start, min(span.end, view.num_layers)):
                out[layer] += r.throughput
    return out


def layer_servers(view: SwarmView, *, without: str | None = None) -> list[int]:
    """Per-layer count of ONLINE peers that will go on serving the layer: a moving peer counts
    only on the layers it keeps (it stops serving the rest at its swap)."""
    out = [0] * view.num_layers
    for r in view.records.values():
        span = _staying_layers(r)
        if span is not None and r.peer_id != without:
            for layer in range(span.start, min(span.end, view.num_layers)):
                out[layer] += 1
    return out


def staying_throughput(view: SwarmView, *, without: str | None = None) -> list[float]:
    """Per-layer throughput of the servers layer_servers counts (ONLINE, on the layers they keep)."""
    out = [0.0] * view.num_layers
    for r in _sorted_records(view):
        span = _staying_layers(r)
        if span is not None and r.peer_id != without:
            for layer in range(span.start, min(span.end, view.num_layers)):
                out[layer] += r.throughput
    return out


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
    out = [0] * view.num_layers
    for r in view.records.values():
        span = _balanced_layers(r)
        if span is not None and r.peer_id != without:
            for layer in range(span.start, min(span.end, view.num_layers)):
                out[layer] += 1
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


def choose_window(
    throughput: Sequence[float], num_layers: int, servers: Sequence[int] | None = None,
    discount: float = SOLE_DISCOUNT, bottleneck: int | None = None, guarded: Sequence[bool] | None = None,
) -> LayerRange:
    """The window of `num_layers` consecutive layers that most needs another server.

    Ranked by, in order: most uncovered layers inside (servers == 0 with `servers`, else
    throughput <= 0; a layer only another tier holds is not uncovered); lowest minimum
    throughput inside (the window holds the bottleneck); lowest total throughput inside;
    lowest start. With `servers` (per-layer counts) the ranking uses strengths (strengths(),
    a sole-served layer at `discount` unless `guarded`) instead of throughput. With `bottleneck`
    (a layer, see routing.flow.bottleneck_layer), no gap, and no unguarded layer with one server
    in the weakest window: the window holding that layer with the lowest total. Runs in
    O(layers) with C-speed builtins on the common path.
    """
    if servers is not None:
        throughput = strengths(throughput, servers, discount, guarded)
    total = len(throughput)
    if total == 0:
        raise ValueError("cannot choose layers of a model with 0 layers")
    if num_layers <= 0:
        raise ValueError(f"a peer must hold at least one layer, got {num_layers}")
    k = min(num_layers, total)
    if k == total:
        return LayerRange(0, total)
    if servers is not None and 0 in servers:
        # Real gaps (nobody at all) come before layers only smaller peers hold (tiered
        # throughput 0, see layer_throughput's min_layers).
        return _cover_most_gaps([0.0 if n == 0 else max(v, _NOT_A_GAP) for v, n in zip(throughput, servers)], k)
    lowest = min(throughput)
    if lowest <= 0 and servers is None:
        return _cover_most_gaps(throughput, k)
    weakest = _weakest_window(throughput, k, lowest)
    if bottleneck is None or not 0 <= bottleneck < total:
        return weakest
    if servers is not None and any(servers[i] == 1 and not (guarded and guarded[i])
                                   for i in range(weakest.start, weakest.end)):
        return weakest  # a layer one departure from a gap comes first
    # Flow-aware: among the windows holding the max flow's bottleneck (routing.flow), the one
    # with the lowest total strength; capacity anywhere else would not raise the flow.
    return window_holding(throughput, k, bottleneck)


def window_holding(throughput: Sequence[float], k: int, layer: int) -> LayerRange:
    """Among the windows of k layers that hold `layer`, the one of lowest total (ties: lowest start)."""
    total = len(throughput)
    start = min(range(max(0, layer - k + 1), min(layer, total - k) + 1),
                key=lambda s: (sum(throughput[s : s + k]), s))
    return LayerRange(start, start + k)


def _weakest_window(throughput: Sequence[float], k: int, lowest: float) -> LayerRange:
    """The window holding a layer at the minimum `lowest` with the lowest total (ties: lowest start)."""
    # Only windows containing a layer at the global minimum can have the lowest minimum.
    total = len(throughput)
    candidates: set[int] = set()
    position = _index(throughput, lowest, 0)
    while position >= 0:
        candidates.update(range(max(0, position - k + 1), min(position, total - k) + 1))
        position = _index(throughput, lowest, position + 1)
    best = min(candidates, key=lambda s: (sum(throughput[s : s + k]), s))
    return LayerRange(best, best + k)


def plan_move(
    others: Sequence[float],
    others_online: Sequence[int],
    current: LayerRange,
    my_throughput: float,
    quality: float = DEFAULT_QUALITY,
    others_counted: Sequence[int] | None = None,
    discount: float = SOLE_DISCOUNT,
    guarded: Sequence[bool] | None = None,
    others_staying: Sequence[float] | None = None,
    thin_limit: float = 0.0,
    swarm_down: bool = False,
) -> LayerRange | None:
    """Where a peer now serving `current` should move, or None to stay.

    `others` / `others_online` are the per-layer throughput and ONLINE server counts of the
    swarm without this peer. The candidate is choose_window(others, len(current)). Let the
    local bottleneck be the minimum per-layer throughput over the layers of `current` and
    the candidate together (the only layers a move changes). Move iff
      * the candidate differs from `current`,
      * every layer it serves now has another ONLINE server (one that is not moving away):
        a peer whose memory holds only its own range stops serving to load the new one
        (a peer with room for both keeps serving, peer/server.py migrate, but none counts
        on it), so even a layer it keeps would go dark for the load;
      * with `others_staying` (per-layer throughput of those other staying servers), none of
        those layers falls below `thin_limit` without it (thin_layers): the move would open on
        its old layers the dip it means to close elsewhere, for a whole reload; and
      * local bottleneck now < quality * local bottleneck after the move
        (i.e. it grows by more than 1/quality).
    The swarm's global bottleneck therefore never drops, and rises when it lies in the
    candidate; each move also strictly improves the sorted throughput vector, so moves
    cannot cycle.

    `swarm_down`: some layer outside `current` has no server at all, so no route exists. Then
    the second and third conditions give way where the candidate takes every layer only this
    peer serves (vacates_only_into): while it loads, those layers are dark in a swarm that is
    down anyway, and once loaded it lights the gap. Without this, a sole server of one layer
    next to a gap only it could fill would never move, and the gap would stay.

    With `others_counted` (per-layer ONLINE + JOINING counts without this peer) every
    throughput above is a layer's strength (strengths(), `guarded` layers undiscounted): the
    candidate is choose_window(others, k, others_counted) and the test compares the weakest
    touched strengths. A layer's strength depends on that layer alone, so the same argument holds:
    the sorted strength vector strictly improves, no cycles.
    """
    if not 0 < quality <= 1:
        raise ValueError(f"quality must be in (0, 1], got {quality}")
    target = choose_window(others, len(current), others_counted, discount, guarded=guarded)
    if target == current:
        return None
    if not leaves_safely(current, others_online, others_staying, thin_limit) and not (
            swarm_down and vacates_only_into(current, target, others_online)):
        return None
    mine = set(range(current.start, current.end))
    theirs = set(range(target.start, target.end))
    touched = mine | theirs  # only these layers change; far-apart ranges stay O(k)
    if others_counted is None:
        before = min(others[layer] + (my_throughput if layer in mine else 0.0) for layer in touched)
        after = min(others[layer] + (my_throughput if layer in theirs else 0.0) for layer in touched)
        return target if before < quality * after else None
    weakest_now = min(_strength(others, others_counted, layer, layer in mine, my_throughput, discount, guarded)
                      for layer in touched)
    weakest_then = min(_strength(others, others_counted, layer, layer in theirs, my_throughput, discount, guarded)
                       for layer in touched)
    return target if weakest_now < quality * weakest_then else None


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


def strengths(throughput: Sequence[float], servers: Sequence[int], discount: float = SOLE_DISCOUNT,
              guarded: Sequence[bool] | None = None) -> list[float]:
    """Per-layer throughput, a sole-served layer's at `discount` of it unless `guarded` (0 stays 0)."""
    if guarded is None:
        return [t * discount if n == 1 else t for t, n in zip(throughput, servers)]
    return [t * discount if n == 1 and not g else t for t, n, g in zip(throughput, servers, guarded)]


def _strength(others: Sequence[float], counted: Sequence[int], layer: int, mine: bool, thr: float,
              discount: float, guarded: Sequence[bool] | None) -> float:
    value = others[layer] + (thr if mine else 0.0)
    return value * discount if counted[layer] + mine == 1 and not (guarded and guarded[layer]) else value


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
    for r in _sorted_records(view):
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


def possible_takers(view: SwarmView, me: str) -> list[str]:
    """Peers that could still take over `me`'s layers: JOINING and moving ones (they are
    choosing), and ONLINE ones whose own layers keep another ONLINE server besides them and
    `me` (plan_move would let them leave). Without any, a draining peer waits for nobody.
    """
    servers = layer_servers(view, without=me)
    out = []
    for r in _sorted_records(view):
        if r.peer_id == me or r.standby:
            continue
        own = range(r.layers.start, min(r.layers.end, view.num_layers))
        if r.state is PeerState.JOINING or r.moving_to is not None or (
                r.state is PeerState.ONLINE and all(servers[i] > 1 for i in own)):
            out.append(r.peer_id)
    return out


def choose_layers(view: SwarmView, num_layers: int) -> LayerRange:
    """The layers a new peer that can hold `num_layers` layers should serve (see choose_window),
    weighing the peers of its tier (at least `num_layers` layers; module docstring).

    Flow-aware unless redundancy comes first: when the weakest window has no layer with a single
    server, the window holds the max flow's bottleneck layer (routing.flow.bottleneck_layer) of
    the ONLINE and JOINING peers. Measured in the simulator (docs/balancing.md, 2x, half the
    departures graceful): max flow +6-7 points of the capacity bound for about as many sole
    servers. One coarse max flow per join: tens of ms at 1,000 peers and 5,000 layers.
    """
    placement = balanced_placement(view)
    bottleneck = bottleneck_layer(placement, view.num_layers) if placement else None
    return choose_window(layer_throughput(view, min_layers=num_layers), num_layers, layer_counts(view),
                         bottleneck=bottleneck, guarded=guarded_layers(view))


def balanced_placement(view: SwarmView, *, without: str | None = None) -> list[tuple[LayerRange, float]]:
    """(layers, layer-tokens/s) of every peer balancing counts (a mover at its target), for routing.flow."""
    return [(LayerRange(span.start, min(span.end, view.num_layers)), len(span) * max(r.throughput, 0.0))
            for r in _sorted_records(view)
            if r.peer_id != without and (span := _balanced_layers(r)) is not None and span.start < view.num_layers]


def should_move(
    view: SwarmView,
    me: str,
    *,
    quality: float = DEFAULT_QUALITY,
    my_throughput: float | None = None,
) -> LayerRange | None:
    """The range peer `me` should move to, or None to stay (see plan_move for the rule), weighing
    the peers of its tier (at least as many layers as it holds; module docstring).

    `my_throughput` overrides the announced one (e.g. a fresh measurement).
    """
    record = view.records.get(me)
    if record is None:
        raise ValueError(f"peer {me!r} is not in the view of model {view.model}")
    current = LayerRange(
        min(record.layers.start, view.num_layers - 1), min(record.layers.end, view.num_layers)
    )
    return plan_move(
        layer_throughput(view, without=me, min_layers=len(current)),
        layer_servers(view, without=me),
        current,
        record.throughput if my_throughput is None else my_throughput,
        quality,
        layer_counts(view, without=me),
        guarded=guarded_layers(view),
        others_staying=staying_throughput(view, without=me),
        thin_limit=thin_threshold(view),  # my capacity stays in the swarm: the mean counts it
        swarm_down=swarm_down(view, current),
    )


def _cover_most_gaps(throughput: Sequence[float], k: int) -> LayerRange:
    """Windows ranked by (most uncovered layers, lowest total throughput, lowest start).

    Only windows touching an uncovered layer can win, so just those are scored, each with
    C-speed slice builtins: a handful of gaps in a 50,000-layer model costs microseconds.
    """
    if min(throughput) < 0:
        throughput = [max(value, 0.0) for value in throughput]  # negative means nobody too
    total = len(throughput)
    # Fast path: the first window made only of gaps ranks first (most gaps, total 0, lowest
    # start). Jumping from gap to gap, past any served layer, keeps this O(layers / k).
    position = _index(throughput, 0.0, 0)
    while 0 <= position <= total - k:
        window = throughput[position : position + k]
        if window.count(0.0) == k:
            return LayerRange(position, position + k)
        served = max(i for i, value in enumerate(window) if value != 0.0)
        position = _index(throughput, 0.0, position + served + 1)
    candidates: set[int] = set()
    position = _index(throughput, 0.0, 0)
    while position >= 0:
        candidates.update(range(max(0, position - k + 1), min(position, total - k) + 1))
        position = _index(throughput, 0.0, position + 1)

    def rank(s: int) -> tuple[int, float, int]:
        window = throughput[s : s + k]
        return (-window.count(0.0), sum(window), s)

    best = min(candidates, key=rank)
    return LayerRange(best, best + k)


def _index(values: Sequence[float], value: float, start: int) -> int:
    """values.index(value, start), or -1; works for lists and tuples alike."""
    try:
        return values.index(value, start)  # type: ignore[attr-defined]
    except ValueError:
        return -1


def _sorted_records(view: SwarmView) -> list[PeerRecord]:
    # Summation order fixed by peer id, so equal views give bit-identical floats.
    return [view.records[p] for p in sorted(view.records)]
