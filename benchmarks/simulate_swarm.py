"""Discrete-event simulation of a churning swarm that balances itself with routing/.

Peers join (choose_layers), check every randomised balance period whether to move
(should_move), and leave abruptly or gracefully; clients plan routes (plan_route). The simulator calls
the same routing functions the peer and client code call: the array-level forms
choose_window / plan_move on per-layer arrays it keeps incrementally (so a 10,000-peer
swarm needs no O(peers) view rebuild per decision), and plan_route on a real SwarmView
built at each route sample.

    .venv/bin/python -m benchmarks.simulate_swarm --peers 1000 --hours 6 --seed 0

Model: a peer holds k layers (its memory) and pushes `thr` tokens/s through all of them;
it adds thr to the throughput of each of its layers. Loading weights takes
LOAD_S_PER_LAYER * k seconds, during which the peer is JOINING (counted by balancing,
serves no routes). --move-load-s-per-layer gives moves (a GPU peer's or a standby's) their own
speed, from --prefetch-s after a joiner first serves: peers that prefetched the model
(swarm-peer serve --prefetch) read a move's layers from disk, not the network. --pre-read silent: a
GPU peer's periodic check first reads its move's target into memory at that speed, announcing nothing
and serving on, then decides again, and a target inside what it read loads at --warm-load-s-per-layer
(swarm-peer serve --pre-read; --pre-read announced: read after the announcement, worse).
Lifetimes are exponential at rate `churn` per hour; arrivals are Poisson
at peers * churn per hour, so the population stays near `peers`. A share `graceful` of the
departures drain (swarm-peer drain / SIGTERM): the peer turns DRAINING, leaves balancing's
counts but keeps serving until every layer it holds has another ONLINE server or
`drain_max_s` passes. The rest are abrupt (a crash, a closed laptop).

Joins are flow-aware (routing.choose_layers): the window holds the max flow's bottleneck layer.
Joins and moves are tiered as in routing.balance: a peer weighs only the peers holding at
least as many layers as it does (per-size arrays here), and staggered: windows are also ranked by
the throughput crossing their inner boundaries, weighed most in their middle (routing.balance.stagger_weights;
--no-stagger: they abut, the rule before the nineteenth session).
--warmup-hours runs the swarm before measuring, so the numbers describe its steady state rather
than its first placement; --start profile starts the first peers at the near-optimal profile placement
instead of the join rule's (an oracle: what a better placement is worth under churn). --trace FILE
writes the served max flow at every change of the measured hours with the event that caused it
(benchmarks/sim_trace.py); benchmarks/sim_dips.py splits the time below the usual level by cause.
--branch SPEC (with --trace) forks the run every --branch-every seconds of its measured hours into branches
that run on --branch-horizon seconds under other rules, each paired with the run over the same window by
benchmarks/sim_branches.py: a rule acting within a minute of a crash judged from identical states.
An abrupt leaver stops serving at once, but its record (and so its weight in balancing) stays
until it expires, 2/3 to 3/3 of RECORD_TTL_S later (peers re-announce every ttl / 3), or, when
it was serving routes, until the crash watch drops it (peer/crash_watch.py): CRASH_SEEN_S after
a process died, VANISHED_SEEN_S after a host vanished (--vanished-share of the abrupt departures;
a client's failed step or unanswered stall probe, its suspect report, a peer's failed probe),
whichever comes first; every peer reacts CRASH_PUSH_S later, told by crash notices
(peer/crash_notices.py; --no-crash-push: at its next watch read, the peer before). The swarm is taken as busy, so every serving peer carries
some session that notices its crash (--no-crash-watch: records always last until they expire).
Reaction, timed as peer/balancer.py does: peers re-read the DHT every WATCH_PERIOD_S (+-25%)
and decide at once (routing.urgent_layers) when some layer has no ONLINE server: a DRAINING
sole server, or a gap whose record expired. Peers wait first (peer/balancer.py react_delay):
while some layer has no GPU server, REACT_DELAY_PER_LAYER_S per layer they hold more than the
smallest peers (--react-first-step: plus one; --gap-delay-per-layer-held: per layer they hold), so the fastest
loaders move first, in parallel while gaps are left; otherwise the largest peers first, which
refill a departed large peer's range in one move (--small-first-always: the fastest always); a
peer whose leaving would leave one of its layers to a single server no standby guards waits one
step more (routing.exposes_on_leaving; --exposing-peers-react-as-soon: the rule before), and one
whose move would download its layers (its prefetch not done) decides after every peer that loads
from disk (--downloaders-react-as-soon: the rule before). A move's load starts after its
confirmation (MOVE_CONFIRM_S), but a reacting peer that goes first among the peers that may decide with
it on its layers skips it (peer/balancer.py must_confirm; --confirm-every-reaction: the rule before). A
periodic balance check whose view shows a layer no GPU peer serves decides as a reaction, after the peer's
react delay (--periodic-takes-gaps: at once, the rule before). A
moving peer counts at its target at once (its record), so the others see the layers taken. Thin layers
(routing.thin_layers: staying servers below THIN_SHARE of the mean layer throughput) wake them
the same way, a draining peer whose layers would be thin without it stays while a peer
loads there (peer/drain.py), and no peer moves away from layers it would leave thin
(routing.plan_move; --no-thin: gaps alone, drains leave once covered, moves only keep them covered).
At a periodic check (not a reaction to a gap or thin layer) such a strength move goes only when it
gives a layer with at most one server a second or raises the max flow (routing.move_gate;
--ungated-strength-moves: every one goes, the rule before). A peer whose check finds no move that
goes may still move to where the max flow runs dry, at most once per FLOW_MOVE_COOLDOWN_S
(routing.flow_move; --no-flow-moves: never), searching every window holding the first short layer
(--flow-move-search never: only the lowest-total one, the rule before the twenty-eighth session).

The model has num_layers = sum(k) / redundancy layers, so `redundancy` is how many times
the swarm's memory could hold the model.

Standbys (--standby-share): that share of the peers also runs `swarm-peer serve --standby` in
host memory, as many layers as its GPU holds, loading as slowly. A standby places itself with
routing.standby_window on the layers one crash would leave dark, its host's excepted (one crash
takes both), re-deciding at its next read of the view (WATCH_PERIOD_S) after anything changes
them, and leaves with its host (--standby-by-layer: while loading it serves each layer as it
arrives, in routing.standby.load_order, as the peer does). Coverage counts a layer a standby serves as served (routes use
it only then, slowly; a standby that carries sessions, i.e. serves a layer no live GPU peer serves,
does not move), and the time some layer was served by standbys alone is reported; the
GPU peers' balancing counts standbys only as guards (no SOLE_DISCOUNT where one is; off with
--no-guard-discount, and the GPU peers' run is the same as without standbys). Throughput figures
leave them out by default (a CPU's share is negligible): while only standbys serve some layer, the
max-flow sample is 0. A standby can instead run on its host's GPU, streaming its weights from
pinned host memory at every step (swarm-peer serve --standby --stream-weights; a streamed step is
the copy, about constant in the batch): --standby-stream-ratio R is a resident layer's step over a
streamed one's on the host's GPU (benchmarks/bench_streamed_standby.py's stream_ratio), so a
standby serving m layers no GPU peer serves carries R x its host's per-layer rate (thr x k) / m
tokens/s through each of them, and --standby-stream-host-slowdown H cuts its host's own capacity
by H meanwhile (measured beside each other on the H200 at 16-64 sequences a step, each process at a
GPU peer's 4 CPU threads: R 0.029-0.042, H about 0.2; the earlier R 0.083, H 0.71-0.75 were two
processes of 16 threads on 16 cores; docs/performance.md). Only the max-flow sample changes (the bound, spread routes and every decision
do not), so a run is paired with the same seed's run without them.

--serve-by-layer: a loading GPU peer (a joiner or a mover) serves each layer as it arrives, as one
growing range (routing.standby.load_order: layers no GPU peer serves first, then the thinnest),
instead of nothing until its whole window is there: `--serve-by-layer all` is what the GPU peer does
(peer/moves.py, and its joins since the fifteenth session: peer/server.py _join_growing);
`--serve-by-layer moves`: movers only, the peer before (its joins loaded the whole window). From its first
layer on it counts as a staying server of what it has, per layer at its thr (as a loaded peer
would), and in the max flow at its whole capacity k * thr (a peer spends its compute on whichever
layers it holds, routing/costs.py). It is still `loading` for every decision that asks: it does not
balance, react or drain, and a drainer next to it still waits for it as for any loader. Loaders of
one dark stretch take turns (routing.gap_weight: each starts where the others, by their announced
orders, arrive last); --no-coordinated-loads: each loads from its window's end, the rule before. A
mover announces its order as its load starts, not through its confirmation (--orders-while-confirming:
from its decision on, the rule before the forty-fifth session).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import random
import sys
import time
import traceback
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.sim_branches import Brancher, BranchSpec, apply_overrides, validate
from benchmarks.sim_optimum import optimum_bracket, profile_placement
from benchmarks.sim_report import SimResult, format_table, plot
from benchmarks.sim_standby_round import StandbyScores
from benchmarks.sim_swarm_state import (
    SimPeer,
    SwarmArrays,
    WithoutPeer,
    announced_orders,
    array_mismatches,
    recount,
)
from benchmarks.sim_trace import FlowTrace
from routing import (
    DEFAULT_QUALITY,
    FLOW_MOVE_COOLDOWN_S,
    SOLE_DISCOUNT,
    NoRouteError,
    choose_window,
    first_arrivals,
    gap_weight,
    plan_flow_move,
    plan_move,
    plan_route,
    route_cost,
    standby_window,
    swarm_flow,
)
from routing.flow import bottleneck_layer, max_flow_of
from routing.flow_move import MOVER_SHARE_GAIN, flow_move_gain
from routing.move_gate import seconds_a_lone_layer, strength_move_pays
from routing.spread import flow_weights, full_flows
from routing.standby import STANDBY_MARGIN, exposure, load_order
from swarm.types import LayerRange, PeerRecord, PeerState, SwarmView

# GPU classes (layers held, median tokens/s through them, share of peers): a mix of
# 8 GB / 12-16 GB / 24 GB / 48-80 GB cards; bigger cards hold more and run faster.
GPU_CLASSES = ((4, 10.0, 0.30), (8, 20.0, 0.35), (16, 35.0, 0.25), (24, 50.0, 0.10))
# Spread of throughput inside a class (lognormal sigma): drivers, CPUs, thermal limits.
THROUGHPUT_SIGMA = 0.3
# Seconds to fetch and load one layer's weights (a few hundred MB from a local cache).
LOAD_S_PER_LAYER = 5.0
# Mean seconds between a peer's balance checks (uniform in [0.5, 1.5] x this, so peers do
# not decide in lockstep and herd to the same spot).
BALANCE_PERIOD_S = 600.0
SNAPSHOT_EVERY = 10  # --snapshots: every 10th route sample (each 10 simulated minutes at --route-period 60)
METRIC_PERIOD_S = 60.0  # bottleneck / bound sampled once a simulated minute
ROUTE_PERIOD_S = 600.0  # a client route planned (and the max flow taken) every 10 simulated minutes
RTT_RANGE_S = (0.01, 0.15)  # client-to-peer round trips, uniform
# Mirrors of the peer's constants (peer/balancer.py, peer/config.py; not imported: that pulls in torch).
WATCH_PERIOD_S = 5.0  # peers re-read the view this often (+-25%) to spot layers nobody ONLINE serves
REACT_DELAY_PER_LAYER_S = 0.5  # then wait this long per layer they hold before deciding
RECORD_TTL_S = 30.0  # swarm-peer --announce-ttl; re-announced every third of it
# From an abrupt departure until a peer's read of the view drops the record; the read itself comes at
# the next watch (WATCH_PERIOD_S, added by the reaction as for an expiry). Two kinds (SimConfig.vanished_share):
# A process that died closes its streams: a client's step fails at once, its re-dial is refused, its
# suspect report is stored (~0.5 s), and the peer's own probe is refused at once.
CRASH_SEEN_S = 1.5
# A host that vanished (a closed laptop, a dropped link) closes nothing: the client probes the silent
# hop after four of its decode steps but at least ClientConfig.stall_probe_min_s (1 s; client/stall.py
# stall_wait: the busy swarm's sessions have timed their hops), waits out the probe (1 s), reports it
# (~0.5 s), and the peer's own probe waits out peer/server.py PROBE_TIMEOUT_S (1 s). 6.5 s before the
# thirty-fifth session (2-s waits each; --vanished-seen-s 6.5). Before the stall probe (eighteenth
# session) the client waited out its 30-s step timeout and a 15-s re-dial: the record expired first.
VANISHED_SEEN_S = 3.5
# Crash notices: the client that reports a suspect also tells a few peers, who tell a few more
# (peer/crash_notices.py), so every peer probes the suspect and looks at once, not at its next watch
# read: fan-out 8 reaches 2,000 peers in four hops of one round trip each (RTT_RANGE_S), plus one
# DHT read of the view. 1 s, generously. (The peer starts its react delay on its last view less the
# peer its probe found dead, and reads the view after it, records and reports at once: one read on
# the way, as here. Before the forty-fourth session it read twice, and the reports after the records.)
CRASH_PUSH_S = 1.0
# peer/balancer.py MOVE_CONFIRM_S: a mover announces its move and re-reads the view this much later before
# it frees its old range and starts loading (two peers leaving one range at once both step back).
MOVE_CONFIRM_S = 1.0
DRAIN_MAX_S = 600.0  # a draining peer leaves after this even if its layers are not covered
THIN_GRACE_S = 10.0  # peer/drain.py: covered but thin, a drainer waits this long for a replacement to start loading


@dataclass
class SimConfig:
    peers: int = 1000
    hours: float = 6.0  # measured, after the warm-up
    seed: int = 0
    churn: float = 0.10  # fraction of peers leaving per hour
    redundancy: float = 2.0
    layers: int | None = None  # set the model size directly instead of via redundancy
    quality: float = DEFAULT_QUALITY
    balance_period_s: float = BALANCE_PERIOD_S
    load_s_per_layer: float = LOAD_S_PER_LAYER
    move_load_s_per_layer: float | None = None  # a move's load, GPU peer or standby (from disk: swarm-peer serve --prefetch); None: load_s_per_layer
    # A sensitivity, not the peer: a GPU peer's move made reacting to a gap or thin layer (a refill) loads
    # this fast once prefetched, as if it read the layers from memory (the page cache: 0.24 s a 70B layer on
    # an H100 lease, docs/performance.md); None: as any move.
    refill_load_s_per_layer: float | None = None
    # A GPU peer's move reads its target's weight files into the page cache before it frees its old range,
    # at the move's load speed (from disk), and then loads at warm_load_s_per_layer a layer. "silent": a
    # periodic check's move, before it is announced: the peer reads, then decides again on the swarm of
    # then (reacting to a gap or thin layer meanwhile drops the read), and a target inside what it read
    # loads from memory (swarm-peer serve --pre-read; peer/balancer.py, which also moves at once into a
    # target with a gap: rare at a periodic check, reactions come first; not modelled). Tried, and worse: "announced", a
    # periodic move read after its announcement and confirmation, balancing counting the mover at its
    # target meanwhile (its old range looks thin to the others all along). "go": as "silent", but after the
    # read the move decided before it goes, if p's layers keep another server (no second decision; its
    # trace cause is "move_strength"). "never": no reads.
    pre_read: str = "never"
    warm_load_s_per_layer: float = 0.25  # a 70B layer from the page cache onto an H100 (docs/performance.md)
    prefetch_s: float = 0.0  # ... once this long after a joiner first serves (its background prefetch); the first peers at once
    graceful: float = 0.0  # share of departures that drain instead of vanishing
    drain_max_s: float = DRAIN_MAX_S
    react: bool = True  # decide at once when a layer has no ONLINE server (else wait for the period)
    redundancy_aware: bool = True  # balance on strengths (sole-served layers discounted), not throughput alone
    sole_discount: float = SOLE_DISCOUNT  # strength of a layer with one server (1: throughput alone)
    flow_join: bool = True  # joiners take a window holding the max flow's bottleneck (routing.flow)
    fast_fill: bool = True  # gaps are filled by the fastest loaders first, in parallel
    tiered: bool = True  # a peer weighs only peers holding at least as many layers (routing.balance)
    stagger: bool = True  # windows straddle boundaries few windows cross (routing.balance.STAGGER_WEIGHT)
    warmup_hours: float = 0.0  # simulated first, not measured: the steady state, not the start, is reported
    # Where the first peers (loaded at t = 0) sit: "joins", placed one by one by the join rule, as a swarm
    # grows; "profile", at benchmarks.sim_optimum.profile_placement (within 0-3% of the optimum, a layout no
    # peer's rule builds): an oracle's start, to see what a near-optimal placement is worth under churn.
    start: str = "joins"
    standby_share: float = 0.0  # share of peers also running a standby in host memory (swarm-peer serve --standby)
    # A resident layer's step over a streamed one's on a standby's host GPU (--stream-weights): the
    # standby carries this times its host's thr x k, shared by the m layers only it serves (0: none, a
    # CPU's share). Measurement only: it changes the max-flow sample, nothing else.
    standby_stream_ratio: float = 0.0
    standby_stream_host_slowdown: float = 0.0  # ... while it streams, its host keeps 1 - this of its capacity
    thin: bool = True  # thin layers wake peers, hold drains and moves (routing.thin_layers); False: gaps alone
    guard_discount: bool = True  # no SOLE_DISCOUNT on layers a standby holds (routing.guarded_layers)
    route_period_s: float = ROUTE_PERIOD_S  # seconds between route and max-flow samples
    flow_moves: bool = True  # a peer that should_move keeps in place may move for the max flow (routing.flow_move)
    # A periodic check's strength move goes only when it gives a lone layer a second server or raises the
    # max flow (routing.move_gate); False: every strength move goes (the rule before the twenty-ninth session).
    strength_gate: bool = True
    # A periodic check's strength move waits this long after the peer's last move (reactions never wait);
    # 0: no wait (the rule now). A sensitivity for the move budget: flow moves wait FLOW_MOVE_COOLDOWN_S.
    strength_move_cooldown_s: float = 0.0
    strength_wait_all: bool = False  # the wait holds every such move, also one that seconds a lone layer
    # Whether a flow move searches every window (routing.flow_move): "always" as the peer does, "never"
    # (the lowest-total window holding the bottleneck, if it reaches the aim: the rule before the twenty-eighth session).
    flow_move_search: str = "always"
    flow_move_gain: float | None = None  # None: routing.flow_move_gain (the mover's share); a share: that, for every peer
    flow_move_cooldown_s: float = FLOW_MOVE_COOLDOWN_S
    mover_share_gain: float = MOVER_SHARE_GAIN  # with flow_move_gain None: the multiple of the mover's share
    crash_watch: bool = True  # a serving peer's crash is seen after CRASH_SEEN_S, not at record expiry
    vanished_share: float = 0.5  # share of abrupt departures that are vanished hosts, seen after vanished_seen_s
    vanished_seen_s: float = VANISHED_SEEN_S
    watch_period_s: float = WATCH_PERIOD_S  # how often peers and standbys re-read the view (swarm-peer --watch-period)
    crash_push: bool = True  # a crash the watch saw reaches every peer after CRASH_PUSH_S, not at its next read
    standby_stays_in_use: bool = True  # a standby serving sessions does not move (peer/balancer.py standby_loop)
    small_first_always: bool = False  # the fastest loaders refill first even while every layer has a GPU server (the rule before)
    gap_delay_from_smallest: bool = True  # on a gap the smallest peers wait one step, not one step per layer they hold
    # A mover serves its old range through its react wait and the move's confirmation (MOVE_CONFIRM_S),
    # then frees it and loads, as the peer does; False: it stops serving when it decides and loads after
    # its react wait alone (the simulator before the thirty-sixth session).
    mover_serves_while_waiting: bool = True
    standby_pair_weight: float = 0.0  # routing.standby.exposure's weight of an unguarded two-server layer
    standby_by_layer: bool = False  # a loading standby serves each layer as it arrives, the most exposed first
    standby_idle_moves: bool = False  # a standby guarding nothing moves for one exposed layer (not STANDBY_MARGIN)
    react_clean_first: bool = True  # a reacting peer whose leaving leaves an unguarded sole server waits one step more (routing.exposes_on_leaving)
    # A reacting peer whose move would download (not prefetched yet, with move_load_s_per_layer set) decides after
    # every peer that loads from disk (peer/balancer.py react_delay's `downloads`); False: by its size alone (the rule before).
    downloaders_react_last: bool = True
    # A reacting peer skips its move's confirmation (MOVE_CONFIRM_S) when no peer serving its layers with a lower id
    # may decide within MOVE_CONFIRM_S of it (peer/balancer.py must_confirm): the confirmation is there for two peers
    # leaving one range at the same moment; of such peers the lowest id goes at once, the others confirm and see it.
    first_skips_confirm: bool = True
    # A periodic balance check whose view shows a gap (a layer no GPU peer serves) leaves it to the reaction, which
    # orders its deciders (the fastest loaders first, downloaders last): peer/balancer.py decides such a check as a
    # reaction, after its react delay (here a "react_check" event at that delay). False: it decides at
    # once (the rule before the forty-fifth session), so a downloading peer's check could take a whole dark stretch
    # at 5 s a layer and hold off the disk loaders, which saw it counted there.
    periodic_leaves_gaps_to_reactions: bool = True
    # Steps the first deciders of a reaction wait (the smallest on a gap, the largest on thin layers; peer/balancer.py
    # REACT_FIRST_STEPS): none; 1: the rule before the forty-fourth session.
    react_first_steps: int = 0
    serve_by_layer: bool = False  # a loading GPU peer (joiner or mover) serves each layer as it arrives (gpu_load_order)
    coordinated_loads: bool = True  # ... lighting first the dark layers other loaders reach last (routing.gap_weight)
    # ... counting only the orders of loaders whose load has started (peer/moves.py migrate announces its order once
    # its confirmation is over); False: from the mover's decision on, the rule before the forty-fifth session.
    orders_from_load_start: bool = True
    # A loader that downloads its layers (a joiner, or a mover whose prefetch is not done: 5 s a layer against the
    # disk's 0.6; its record says `downloading`) counts for a reaction, where its target holds a layer no GPU peer
    # serves, only on the layers it has: the rest count as dark (routing.downloads); and its load order counts for
    # no other loader. False: it counts on its whole target (the rule before the forty-sixth session), so a
    # downloading joiner that took a crash's dark stretch a second before the reaction held every disk loader off
    # it and lit it at the network's pace.
    downloads_count_as_dark: bool = True
    # Share of its capacity a GPU peer serving part of its window gets until the whole window is there:
    # the peer decodes those layers eagerly until it captures its CUDA graphs (peer/moves.py).
    growing_share: float = 1.0
    joins_by_layer: bool = True  # ... joiners too, as the GPU peer does (False: movers only, the peer before)
    check_arrays: bool = False  # at every metric sample, compare the incremental arrays with a recount (tests)
    snapshots: str | None = None  # a JSONL file: the serving placement every SNAPSHOT_EVERY-th measured route sample
    trace: str | None = None  # a JSONL file: the served max flow at every change of the measured hours, with its cause (sim_trace)
    # Branches (benchmarks/sim_branches.py): every branch_every_s of the measured hours the run forks, and each of
    # `branches` (BranchSpec texts) runs on for branch_horizon_s from there with its overrides, traced to its own file.
    branches: tuple[str, ...] = ()
    branch_every_s: float = 600.0
    branch_horizon_s: float = 600.0
    branch_at_crashes: bool = False  # ... or at every crash of a serving peer in the measured hours


def draw_peer(pop: random.Random, index: int) -> SimPeer:
    """One peer of the GPU mix, drawn from the population stream `pop`."""
    k, median, _ = pop.choices(GPU_CLASSES, [c[2] for c in GPU_CLASSES])[0]
    return SimPeer(f"peer{index:06d}", k, median * math.exp(pop.gauss(0, THROUGHPUT_SIGMA)), pop.uniform(*RTT_RANGE_S))


def initial_peers(pop: random.Random, count: int, redundancy: float, layers: int = 0) -> tuple[list[SimPeer], int]:
    """The swarm at t = 0 and the model's layers: `layers`, or as many as the peers hold `redundancy` times."""
    initial = [draw_peer(pop, i) for i in range(count)]
    num_layers = layers or max(1, round(sum(p.k for p in initial) / redundancy))
    for p in initial:
        p.k = min(p.k, num_layers)
    return initial, num_layers


def simulate(cfg: SimConfig) -> SimResult:
    """Run the swarm of `cfg`; with cfg.branches, forked branches write their traces and exit (sim_branches)."""
    in_branch = [False]
    try:
        return _simulate(cfg, in_branch)
    except BaseException:
        if in_branch[0]:  # a forked branch must never return into its caller (a test runner, say) as a second copy
            traceback.print_exc()
            os._exit(1)
        raise


def _simulate(cfg: SimConfig, in_branch: list[bool]) -> SimResult:
    wall0 = time.perf_counter()
    # Who arrives, when and how fast, and who leaves when (and how) come from `pop`; the swarm's
    # own choices (timers, tie orders) from `rng`. Runs of two policies with one seed then see
    # the same population: differences are the policies', not the dice's.
    pop = random.Random(cfg.seed)
    rng = random.Random(f"{cfg.seed}-decisions")
    vanish = random.Random(f"{cfg.seed}-vanished")  # which abrupt departures are vanished hosts: its own stream
    # Standbys draw from their own streams, so the GPU peers' runs are the same with or without them.
    has_standby = random.Random(f"{cfg.seed}-standby")
    standby_rng = random.Random(f"{cfg.seed}-standby-decisions")
    initial, num_layers = initial_peers(pop, cfg.peers, cfg.redundancy, cfg.layers)
    swarm = SwarmArrays(num_layers)
    counts = swarm.counted if cfg.redundancy_aware else None
    guarded = swarm.guarded if cfg.standby_share > 0 and cfg.guard_discount else None
    peers: dict[str, SimPeer] = {}
    expiring: dict[str, SimPeer] = {}  # gone abruptly, record not yet expired
    events: list[tuple[float, int, str, str, int]] = []
    seq = 0

    def push(t: float, kind: str, pid: str = "", gen: int = 0) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, pid, gen))

    per_hour = 3600.0
    leave_rate = cfg.churn / per_hour  # per peer per second

    standbys: dict[str, SimPeer] = {}  # by host peer id; `layers` is where it is placed (loading or serving)
    standby_moves = 0
    moves_from_memory = 0  # GPU peers' moves that loaded what they had read into memory (SimConfig.pre_read)
    checks_as_reactions = 0  # periodic checks that saw a gap and decided as reactions (periodic_leaves_gaps_to_reactions)
    refills_past_downloads = 0  # reactions onto layers that only downloading loaders held (downloads_count_as_dark)

    def as_viewed(per_layer: list[int]) -> list[int]:
        """Per-layer server counts as the DHT view shows them: an abruptly gone peer's record lingers until it
        expires, so it still counts there."""
        counts = per_layer[:]
        for q in expiring.values():
            span = q.served  # a peer that crashed while loading by layer: what its record listed
            for layer in range(span.start, span.end) if span is not None else ():
                counts[layer] += 1
        return counts

    def view_servers() -> list[int]:
        """layer_servers as the DHT view shows them."""
        return as_viewed(swarm.staying_n)

    def view_shows_a_gap() -> bool:
        """Does the DHT view show a layer no GPU peer serves (SwarmView.uncovered_layers(standbys=False))?"""
        return swarm.gpu_uncovered > 0 and 0 in as_viewed(swarm.online_n)

    downloaders: dict[str, SimPeer] = {}  # GPU peers whose latest load downloads (SimPeer.downloads); pruned on use

    def downloads_to_come() -> list[tuple[SimPeer, list[int]]]:
        """The loaders that download (SimConfig.downloads_count_as_dark) with a dark layer (no GPU peer serves it)
        still to come, each with the layers of its target still to come: a reaction counts those as dark."""
        out = []
        for pid, q in list(downloaders.items()):
            if peers.get(pid) is not q or not q.loading or not q.downloads:
                del downloaders[pid]
                continue
            arrived = set(q.arrived)
            to_come = [layer for layer in range(q.layers.start, q.layers.end) if layer not in arrived]
            if any(swarm.online_n[layer] == 0 for layer in to_come):
                out.append((q, to_come))
        return out

    def dark_but_for_downloads(span: LayerRange | None = None) -> bool:
        """Is some layer (of `span`) counted (balancing's view) only by downloading loaders that have not brought
        it yet?"""
        to_come = downloads_to_come() if cfg.downloads_count_as_dark else []
        if not to_come:
            return False
        coming = [0] * num_layers
        for _, layers in to_come:
            for layer in layers:
                coming[layer] += 1
        start, end = (0, num_layers) if span is None else (span.start, span.end)
        return any(coming[layer] and swarm.counted[layer] == coming[layer] for layer in range(start, end))

    def host_layers(sb: SimPeer) -> list[LayerRange]:
        """Where standby sb's host serves and loads: one crash takes both, so sb guards nothing there."""
        host = peers.get(sb.peer_id)
        return [] if host is None else [span for span in {host.serving, host.layers} if span is not None]

    def useless(sb: SimPeer) -> list[bool]:
        out = [False] * num_layers
        for span in host_layers(sb):
            out[span.start : span.end] = [True] * len(span)
        return out

    def guards() -> list[int]:
        """Per layer, the standbys that guard it: placed there, and not on their own host's layers."""
        out = swarm.standby_at[:]
        for sb in standbys.values():
            for span in host_layers(sb) if sb.layers is not None else ():  # None: being placed
                for layer in range(max(span.start, sb.layers.start), min(span.end, sb.layers.end)):
                    out[layer] -= 1
        return out

    def move_load_s(q: SimPeer, now: float, refill: bool = False) -> float:
        """Seconds per layer of q's move: from disk once its prefetch is done (a standby: its host's);
        `refill` (a GPU peer reacting to a gap or thin layer): SimConfig.refill_load_s_per_layer if set."""
        if refill and cfg.refill_load_s_per_layer is not None and now >= q.prefetched_at:
            return cfg.refill_load_s_per_layer
        if cfg.move_load_s_per_layer is None or now < q.prefetched_at:
            return cfg.load_s_per_layer
        return cfg.move_load_s_per_layer

    def unserve_standby(sb: SimPeer) -> None:
        if sb.serving is not None:
            swarm.serve_standby(sb.serving, -1)
            sb.serving = None
        for layer in sb.arrived:
            swarm.serve_standby(LayerRange(layer, layer + 1), -1)
        sb.arrived, sb.to_load = [], []

    def place_standby(sb: SimPeer, target: LayerRange, now: float, instant: bool, load_s: float) -> None:
        unserve_standby(sb)
        if cfg.standby_by_layer and not instant:
            # Exposed layers first (routing.standby.load_order), judged before it counts as their guard.
            if sb.layers is not None:
                swarm.place_standby(sb.layers, -1)
                sb.layers = None
            sb.to_load = load_order(target, exposure(view_servers(), guards(), cfg.standby_pair_weight))
        elif sb.layers is not None:
            swarm.place_standby(sb.layers, -1)
        sb.layers, sb.generation = target, sb.generation + 1
        swarm.place_standby(target, +1)
        if instant:
            sb.serving = target
            swarm.serve_standby(target, +1)
        elif cfg.standby_by_layer:
            for i in range(len(target)):
                push(now + load_s * (i + 1), "standby_layer", sb.peer_id, sb.generation)
        else:
            push(now + load_s * sb.k, "standby_online", sb.peer_id, sb.generation)

    def add_standby(host: SimPeer, now: float, instant: bool) -> None:
        if cfg.standby_share <= 0 or has_standby.random() >= cfg.standby_share:
            return
        sb = SimPeer(host.peer_id, host.k, 0.0, host.rtt, prefetched_at=host.prefetched_at)  # one machine, one cache
        target = standby_window(view_servers(), guards(), sb.k, useless=useless(sb), pair_weight=cfg.standby_pair_weight)
        assert target is not None
        standbys[sb.peer_id] = sb
        place_standby(sb, target, now, instant, cfg.load_s_per_layer)

    def standby_round(now: float) -> None:
        """Every standby's next read of the view (peer/balancer.py standby_loop), taken as one round.

        Only standbys that could gain look closer: a window beats a standby's own place by at most
        the best window score with everyone counted, so below the margin nobody moves.
        """
        nonlocal standby_moves
        servers = view_servers()
        ready = [sb for sb in standbys.values() if sb.serving is not None]
        standby_rng.shuffle(ready)
        guarded = guards()
        sizes = {sb.k for sb in ready}
        scores = StandbyScores(servers, guarded, sizes, cfg.standby_pair_weight)
        for sb in ready:
            best = scores.best[min(sb.k, num_layers)]
            if best < max(1.0, STANDBY_MARGIN * sb.k) and not (cfg.standby_idle_moves and best >= 1.0
                                                               and idle(sb, servers, guarded)):
                continue
            if cfg.standby_stays_in_use and any(swarm.online_n[layer] == 0 for layer in range(sb.serving.start, sb.serving.end)):
                continue  # it carries sessions (no live GPU server there): it stays, whatever the view lists
            # standby_window, itself left out of its own layers' guards, its host's layers useless to it
            target = scores.window_for(sb.k, sb.layers, host_layers(sb), cfg.standby_idle_moves)
            if target is not None:
                place_standby(sb, target, now, False, move_load_s(sb, now))
                standby_moves += 1
                guarded = guards()
                scores = StandbyScores(servers, guarded, sizes, cfg.standby_pair_weight)

    def idle(sb: SimPeer, servers: list[int], guarded: list[int]) -> bool:
        """Does standby sb guard nothing where it is (no layer of its window exposed without it)?"""
        hosted = set()
        for span in host_layers(sb):
            hosted.update(range(span.start, span.end))
        for layer in range(sb.layers.start, sb.layers.end):
            if layer not in hosted and servers[layer] <= 1 and guarded[layer] <= 1:
                return False  # exposed but for itself
            if servers[layer] == 2 and cfg.standby_pair_weight > 0 and guarded[layer] - (layer not in hosted) <= 0:
                return False
        return True

    def wake_standbys(now: float, pushed: bool = False) -> None:
        """The GPU peers' layers changed: standbys decide at their next read (one round, deduplicated),
        or (`pushed`: a crash notice) CRASH_PUSH_S from now if that comes sooner."""
        nonlocal standby_round_due
        if not standbys:
            return
        if pushed:
            if not now <= standby_round_due <= now + CRASH_PUSH_S:
                standby_round_due = now + CRASH_PUSH_S
                push(standby_round_due, "standby_round")
        elif standby_round_due < now:
            standby_round_due = now + standby_rng.uniform(0.0, cfg.watch_period_s * 1.25)
            push(standby_round_due, "standby_round")

    standby_round_due = -1.0
    pushed_crashes: set[str] = set()  # crashed peers whose record the crash watch drops, with a notice pushed

    def join_window(p: SimPeer) -> LayerRange:
        """Where the join rule puts p (routing.choose_window on the swarm of now)."""
        bottleneck = None
        if cfg.flow_join:
            placed = [(q.layers, q.thr * q.k) for q in [*peers.values(), *expiring.values()] if not q.draining]
            bottleneck = bottleneck_layer(placed, num_layers) if placed else None
        thr, counted = _balance_arrays(swarm, p.k, cfg, counts)
        return choose_window(thr, p.k, counted, cfg.sole_discount, bottleneck, guarded, crossing=_crossing(swarm, p.k, cfg))

    def admit(p: SimPeer, now: float, instant: bool, window: LayerRange | None = None) -> None:
        """p joins (at `window` if given, else where the join rule puts it) and loads, or with `instant` serves at once."""
        p.layers = window or join_window(p)
        peers[p.peer_id] = p
        if tracer is not None:
            tracer.cause("join", f"{p.peer_id} k={p.k} {p.layers}")
        if not instant:  # a warm swarm's first peers have long had their files
            p.prefetched_at = now + cfg.load_s_per_layer * p.k + cfg.prefetch_s
        swarm.place(p, +1)
        add_standby(p, now, instant)
        if instant:
            go_online(p)
        else:
            load_gpu_peer(p, now, cfg.load_s_per_layer, by_layer=cfg.serve_by_layer and cfg.joins_by_layer)
        if leave_rate > 0:
            push(now + pop.expovariate(leave_rate), "depart", p.peer_id)
        push(now + rng.uniform(0.0, 1.5 * cfg.balance_period_s), "balance", p.peer_id)

    def gpu_load_order(p: SimPeer, decided_at: float) -> list[int]:
        """routing.standby.load_order for a GPU peer p loading p.layers, judged before it counts there.

        A layer no GPU peer serves weighs EXPOSED_GAP (3): while one is left the swarm's max flow is
        0 (clients crawl on a standby, or wait), so one such layer outweighs any thin one; less where
        another loader brings it sooner (routing.gap_weight on the loaders' remaining orders, which
        their records announce once their load has started: sim_swarm_state.announced_orders to p deciding
        at `decided_at`), unless --no-coordinated-loads. A thin layer weighs its shortfall below
        thin_limit as a share of it (0-1): the thinnest bound the flow most, and a layer a drainer
        alone serves (staying 0) counts as fully short, so the
        drainer can go sooner. The rest weigh 0: any order serves them as soon, give or take.
        (routing.move_load_order, on a SwarmView.)
        """
        target = p.layers
        arrivals: dict[int, int] = {}
        if cfg.coordinated_loads:
            arrivals = first_arrivals(announced_orders(peers.values(), p, decided_at, cfg.orders_from_load_start,
                                                       skip_downloads=cfg.downloads_count_as_dark))
        limit = swarm.thin_limit()
        weight = [0.0] * num_layers
        for layer in range(target.start, target.end):
            if swarm.online_n[layer] == 0:
                weight[layer] = gap_weight(arrivals.get(layer), len(target))
            elif limit > 0 and swarm.staying_thr[layer] < limit:
                weight[layer] = 1.0 - swarm.staying_thr[layer] / limit
        return load_order(target, weight)

    def load_gpu_peer(p: SimPeer, now: float, load_s: float, by_layer: bool, decided_at: float | None = None) -> None:
        """p (placed at p.layers, serving nothing) loads its window from `now`; "online" when all is there.
        `by_layer`: it also serves each layer as it arrives, in gpu_load_order as of `decided_at` (default `now`)."""
        p.loads_from = now
        p.downloads = cfg.move_load_s_per_layer is not None and load_s > cfg.move_load_s_per_layer
        if p.downloads:
            downloaders[p.peer_id] = p
        if by_layer:
            p.to_load = gpu_load_order(p, now if decided_at is None else decided_at)
            for i in range(p.k - 1):  # the last layer comes with "online"
                push(now + load_s * (i + 1), "gpu_layer", p.peer_id, p.generation)
        push(now + load_s * p.k, "online", p.peer_id, p.generation)

    def serve_layer(p: SimPeer, now: float) -> None:
        """The next layer of p's load arrived: it serves it, as a staying server (p never drains
        while loading); its capacity counts k * thr in the max flow from the first layer on."""
        layer = p.to_load.pop(0)
        p.arrived.append(layer)
        if tracer is not None:
            tracer.cause("layer", f"{layer} for {p.peer_id} k={p.k} -> {p.layers} ({len(p.arrived)} of {p.k} loaded)")
        swarm.serve(LayerRange(layer, layer + 1), p, +1)
        swarm.stay(LayerRange(layer, layer + 1), p, +1)
        wake_standbys(now)
        wake_drainers(now)

    def unserve_arrived(p: SimPeer) -> None:
        """Take a partly loaded p's layers out of the serving arrays (p.arrived is kept: a crashed
        peer's record lists them until it expires, view_servers)."""
        for layer in p.arrived:
            swarm.serve(LayerRange(layer, layer + 1), p, -1)
            swarm.stay(LayerRange(layer, layer + 1), p, -1)
        p.to_load = []

    def wake_drainers(now: float) -> None:
        for q in [q for q in peers.values() if q.draining]:  # few at a time
            if may_leave(q, now):
                push(now, "drained", q.peer_id)

    def go_online(p: SimPeer) -> None:
        if tracer is not None:
            tracer.cause("online", f"{p.peer_id} k={p.k} {p.layers}")
        p.serving = p.layers
        swarm.serve(p.serving, p, +1)
        swarm.stay(p.serving, p, +1)
        if p.arrived:  # after the whole window is counted, so no layer's count passes through 0
            unserve_arrived(p)
            p.arrived = []

    def leave(p: SimPeer, now: float, seen: float = 0.0) -> None:
        """Stop serving now; an abrupt leaver's record stays in the view until it expires (RECORD_TTL_S)
        or, `seen` s later, the crash watch drops it."""
        served = p.served
        if p.serving is not None:
            swarm.serve(p.serving, p, -1)
            if not p.draining:
                swarm.stay(p.serving, p, -1)
        elif p.arrived:  # it left while loading by layer (a loader leaves at once, graceful or not)
            unserve_arrived(p)
        elif p.leaving is not None:  # it left while waiting to load (serving its old range)
            stop_serving_old(p)
        del peers[p.peer_id]
        sb = standbys.pop(p.peer_id, None)
        if sb is not None:  # a standby leaves with its host
            unserve_standby(sb)
            swarm.place_standby(sb.layers, -1)
        if not p.draining:  # a drained peer announced OFFLINE and left balancing when it started draining
            expiring[p.peer_id] = p
            # The last announcement was 0-10 s ago, so the record outlives its peer by 20-30 s.
            expires = now + rng.uniform(RECORD_TTL_S * 2 / 3, RECORD_TTL_S)
            if cfg.crash_watch and served is not None and now + seen < expires:
                expires = now + seen
                if cfg.crash_push:
                    pushed_crashes.add(p.peer_id)
            push(expires, "expire", p.peer_id)

    tracer = FlowTrace(Path(cfg.trace)) if cfg.trace else None
    view_flow: list = [-1, (0.0, None)]  # (swarm.placements it was computed at, routing.swarm_flow)

    def placed_without(p: SimPeer | None) -> list[tuple[LayerRange, float]]:
        """The placement balancing counts (routing.balanced_placement), peer p (if any) left out."""
        return [(q.layers, q.thr * q.k) for q in [*peers.values(), *expiring.values()] if not q.draining and q is not p]

    def shared_flow() -> tuple[float, int | None]:
        """routing.swarm_flow of the placement balancing counts: every peer reading this view shares it."""
        if view_flow[0] != swarm.placements:
            view_flow[:] = [swarm.placements, swarm_flow(placed_without(None), num_layers)]
        return view_flow[1]

    def try_move(p: SimPeer, now: float, delay: float = 0.0, reacting: bool = False, plan_only: bool = False,
                 warm: LayerRange | None = None) -> LayerRange | None:
        """Balance check of p (`reacting`: to a gap or thin layer): the target it moves to, or None; a move
        decided now starts loading after `delay` (its react wait) and its confirmation. `plan_only`: decide, do
        not move. `warm`: layers p read into memory (SimConfig.pre_read "silent"): a target inside loads from there."""
        others, counted = _balance_arrays(swarm, p.k, cfg, counts)
        others, counted = others[:], None if counted is None else counted[:]
        _leave_out(others, counted, range(p.layers.start, p.layers.end), p.thr)
        if reacting and cfg.downloads_count_as_dark:
            # A downloading loader on dark layers counts only on the layers it has (routing.downloads): the rest come
            # at the network's pace, so for a reaction, whose movers load from disk, they are still dark.
            for q, layers in downloads_to_come():
                if q is not p:
                    _leave_out(others, counted, layers, q.thr if not cfg.tiered or q.k >= p.k else 0.0)
        online = WithoutPeer(swarm.staying_n, p.layers, 1)
        staying = WithoutPeer(swarm.staying_thr, p.layers, p.thr) if cfg.thin else None
        crossing = _crossing(swarm, p.k, cfg)
        if crossing is not None:
            crossing = crossing[:]
            for boundary in range(p.layers.start + 1, p.layers.end):
                crossing[boundary] = max(0.0, crossing[boundary] - p.thr)
        # plan_move's swarm_down (a sole server may shift into a gap while no route exists) is left
        # out: it only acts while some layer has no server, standbys included, which the measured
        # runs with standbys almost never see, and it would make the GPU peers' run depend on them.
        target = plan_move(others, online, p.layers, p.thr, cfg.quality, counted, discount=cfg.sole_discount,
                           guarded=guarded, others_staying=staying, thin_limit=swarm.thin_limit(), crossing=crossing)
        if (target is not None and not reacting and p.moved_at is not None
                and now - p.moved_at < cfg.strength_move_cooldown_s
                and (cfg.strength_wait_all or not seconds_a_lone_layer(p.layers, target, swarm.counted))):
            target = None
        if target is not None and cfg.strength_gate and not reacting:
            # A periodic check's strength move goes only when it pays (routing.move_gate).
            if not strength_move_pays(placed_without(p), num_layers, p.layers, target, p.thr * p.k, swarm.counted,
                                      shared_flow()[0]):
                target = None
        strength = target is not None
        if target is None and cfg.flow_moves and (p.moved_at is None or now - p.moved_at >= cfg.flow_move_cooldown_s):
            others_placed = placed_without(p)
            gain = cfg.flow_move_gain
            if gain is None:
                total = p.thr * p.k + sum(c for _, c in others_placed)
                gain = flow_move_gain(p.thr * p.k, total, cfg.mover_share_gain)
            target = plan_flow_move(others_placed, num_layers, p.layers, p.thr * p.k, others, online, staying,
                                    swarm.thin_limit(), shared_flow(), gain, tier_crossing=crossing,
                                    search=cfg.flow_move_search == "always")
        if target is None or plan_only:
            return target
        return commit_move(p, now, target, delay, reacting, "move_react" if reacting else "move_strength" if strength
                           else "move_flow", warm)

    def commit_move(p: SimPeer, now: float, target: LayerRange, delay: float, reacting: bool, cause: str,
                    warm: LayerRange | None, confirm_s: float = MOVE_CONFIRM_S) -> LayerRange:
        """p moves to `target` (decided now, loading after `delay` and `confirm_s`); `warm`: what it read into memory."""
        nonlocal moves_from_memory
        if tracer is not None and not cfg.mover_serves_while_waiting:  # else the drop comes at "load_starts"
            tracer.cause(cause, f"{p.peer_id} k={p.k} {p.layers} -> {target}")
        # Balancing counts it at the target now, and others see it leave its old range (stay). It
        # serves there on until its load starts, after its react wait and the move's confirmation
        # (mover_serves_while_waiting), then pauses while it loads: a GPU whose memory holds one range
        # cannot keep the old one (a peer with room for both serves on, peer/moves.py migrate;
        # plan_move lets nobody move whose layers would go dark either way).
        swarm.stay(p.serving, p, -1)
        starts = now + delay + (confirm_s if cfg.mover_serves_while_waiting else 0.0)
        if cfg.mover_serves_while_waiting:
            p.leaving, p.leaving_cause = p.serving, cause
        else:
            swarm.serve(p.serving, p, -1)
        p.serving = None
        swarm.place(p, -1)
        p.layers, p.generation, p.moved_at = target, p.generation + 1, now
        swarm.place(p, +1)
        p.pre_reading = None  # a silent pre-read's peer that reacts meanwhile drops it
        load_s = move_load_s(p, now, refill=reacting)
        if warm is not None and warm.covers(target):
            load_s, moves_from_memory = cfg.warm_load_s_per_layer, moves_from_memory + 1
        elif pre_reads(p, now, reacting):
            starts += p.k * load_s  # serving the old range on while it reads the target into memory
            load_s, moves_from_memory = cfg.warm_load_s_per_layer, moves_from_memory + 1
        if p.leaving is not None:
            push(starts, "load_starts", p.peer_id, p.generation)
        load_gpu_peer(p, starts, load_s, by_layer=cfg.serve_by_layer, decided_at=now + delay)
        return target

    def pre_reads(p: SimPeer, now: float, reacting: bool) -> bool:
        """Does mover p, its periodic move announced, read the target's files into memory before it frees its
        old range (SimConfig.pre_read "announced")? Only from disk (once prefetched), and only while it
        serves on (mover_serves_while_waiting)."""
        return (cfg.pre_read == "announced" and not reacting and cfg.mover_serves_while_waiting
                and now >= p.prefetched_at)

    def stop_serving_old(p: SimPeer) -> None:
        """A mover's old range, served while it waited, is freed: its load starts now."""
        swarm.serve(p.leaving, p, -1)
        p.leaving, p.leaving_cause = None, ""

    def urgent() -> bool:
        """Does some layer have no staying server, or is it thin (routing.urgent_layers)?"""
        return 0 in swarm.staying_n or (cfg.thin and swarm.thin())

    def must_confirm(q: SimPeer, candidates: list[SimPeer], delay: dict[str, float],
                     readings: dict[int, list[float]]) -> bool:
        """peer/balancer.py must_confirm: might another peer serving q's layers, with a lower id, decide its
        reaction within MOVE_CONFIRM_S of q? `readings[k]`: the react delays a k-layer peer may have, read as the
        peer reads them from the view (whether it exposes a layer or downloads its moves is not in its record)."""
        if q.serving is None:
            return True
        for r in candidates:
            if r.peer_id >= q.peer_id or r.serving is None or not (
                    r.serving.start < q.serving.end and q.serving.start < r.serving.end):
                continue
            if any(abs(d - delay[q.peer_id]) < MOVE_CONFIRM_S for d in readings[r.k]):
                return True
        return False

    def maybe_react(now: float, delay: float, pushed: bool = False) -> None:
        """Peers react at their next read of the view, or (`pushed`: a crash notice) CRASH_PUSH_S from now."""
        if cfg.react and urgent():
            push(now + delay + (CRASH_PUSH_S if pushed else rng.uniform(0.0, cfg.watch_period_s * 1.25)), "react")

    def react_delays(candidates: list[SimPeer], now: float) -> tuple[dict[str, float], dict[int, list[float]]]:
        """Each candidate's react delay (peer/balancer.py react_delay), and per size the delays a peer of that size
        may have as others read them from its record (must_confirm's `readings`)."""
        sizes = {q.k for q in candidates}
        step = {k: 0.0 for k in sizes}  # a size's react delay before what a peer's record does not say
        extras = [0.0]  # ... and what that may add: nothing while nobody waits (--no-fast-fill)
        delay = {q.peer_id: 0.0 for q in candidates}
        if cfg.fast_fill:
            # Peers wait before deciding (peer/balancer.py react_delay), so they decide one size
            # after another and each sees the layers its predecessors took. While a layer has no
            # GPU server, the fastest loaders first, several in parallel; else (--small-first-always:
            # always) the largest first: one refills a departed large peer's range in one move.
            largest = max((q.k for q in candidates), default=0)
            smallest = min((q.k for q in candidates), default=1)
            gap = bool(swarm.gpu_uncovered) or cfg.small_first_always
            # On a gap the smallest candidates first (after react_first_steps steps), one step more per layer
            # held beyond theirs; on thin layers the largest first, one step more per layer held fewer.
            first = cfg.react_first_steps
            not_waited = smallest - first if cfg.gap_delay_from_smallest else 0
            step = {k: REACT_DELAY_PER_LAYER_S * ((k - not_waited) if gap else (largest - k + first)) for k in sizes}
            delay = {q.peer_id: step[q.k] for q in candidates}
            extras = [0.0, REACT_DELAY_PER_LAYER_S]
            if cfg.react_clean_first:  # one step later for a peer whose leaving exposes a layer
                for q in candidates:
                    # Standbys guard only where the GPU peers count them (guarded: None with --no-guard-discount).
                    if q.serving is not None and any(swarm.staying_n[layer] == 2 and not (guarded and guarded[layer])
                                                     for layer in range(q.serving.start, q.serving.end)):
                        delay[q.peer_id] += REACT_DELAY_PER_LAYER_S
            if cfg.downloaders_react_last and cfg.move_load_s_per_layer is not None:
                downloads_s = REACT_DELAY_PER_LAYER_S * (largest - smallest + 2)
                for q in candidates:
                    if now < q.prefetched_at:  # after every disk loader, exposing or not
                        delay[q.peer_id] += downloads_s
                extras += [e + downloads_s for e in extras]
        readings = {k: [step[k] + e for e in extras] for k in sizes}
        return delay, readings

    def react_move(q: SimPeer, now: float, wait: float, candidates: list[SimPeer], delay: dict[str, float],
                   readings: dict[int, list[float]]) -> bool:
        """q's reaction, decided now on the reaction's `candidates` (their react delays, react_delays): its move, if
        it has one, loading after `wait` (the rest of its react delay) and its confirmation, which it skips when it
        goes first among the peers that may decide with it on its layers (must_confirm). Did q move?"""
        nonlocal refills_past_downloads
        target = try_move(q, now, wait, reacting=True, plan_only=True)
        if target is None:
            return False
        confirm_s = MOVE_CONFIRM_S  # only a peer that moves asks whether it must confirm
        if cfg.first_skips_confirm and not must_confirm(q, candidates, delay, readings):
            confirm_s = 0.0
        if dark_but_for_downloads(target):
            refills_past_downloads += 1
        commit_move(q, now, target, wait, True, "move_react", None, confirm_s)
        wake_standbys(now)
        return True

    def may_leave(p: SimPeer, now: float) -> bool:
        """peer/drain.py: covered, and not thin without it unless nobody loads there after THIN_GRACE_S."""
        if not swarm.covered_without(p):
            return False
        if not cfg.thin or not swarm.thin(p.serving):
            return True
        loading = any(q.loading and q.layers.start < p.serving.end and p.serving.start < q.layers.end
                      for q in peers.values())
        return not loading and now >= drain_started[p.peer_id] + THIN_GRACE_S

    # The optimum of the initial peers lies in this bracket (docs/balancing.md, "The optimum we measure against").
    initial_bound = sum(p.k * p.thr for p in initial) / num_layers
    capacities = [(p.k, p.k * p.thr) for p in initial]
    bracket = optimum_bracket(capacities, num_layers)
    windows: list[LayerRange | None] = [None] * len(initial)  # "joins": the join rule's, one by one
    if cfg.start == "profile":
        windows = list(profile_placement(capacities, num_layers)[1])
    for p, window in zip(initial, windows):  # a warm swarm: the first peers are already loaded at t = 0
        admit(p, 0.0, instant=True, window=window)
    next_index = cfg.peers
    if leave_rate > 0:
        push(pop.expovariate(cfg.peers * leave_rate), "arrive")
    start = cfg.warmup_hours * per_hour
    end = start + cfg.hours * per_hour
    brancher = None
    if cfg.branches:
        if tracer is None:
            raise ValueError("branches are paired with the run's trace: give it one (trace)")
        brancher = Brancher(Path(tracer.path), cfg.branch_every_s, cfg.branch_horizon_s,
                            [BranchSpec.parse(text) for text in cfg.branches], start, end, cfg.branch_at_crashes)

    def branch_here(now: float) -> None:
        """Fork the branches at `now`; in a branch, take its rules, trace and end from here on."""
        nonlocal tracer, end, brancher
        assert brancher is not None and tracer is not None
        spec = brancher.split(now)
        if spec is not None:
            in_branch[0] = True
            apply_overrides(spec, cfg, sys.modules[__name__])
            tracer = tracer.branch(now, brancher.trace_path(spec))
            end = now + cfg.branch_horizon_s
            brancher = None
    if start > 0:
        push(start, "measure")  # before the metric sample at the same time (pushed first)
    for t in range(0, int(end) + 1, int(METRIC_PERIOD_S)):
        push(float(t), "metric")
    for t in range(0, int(end) + 1, max(1, int(cfg.route_period_s))):
        push(float(t) + 0.5, "route")

    joins = departures = migrations = routes_failed = drains = drains_timed_out = warmup_moves = 0
    uncovered_time = uncovered_layer_time = standby_only_time = standby_seconds = 0.0
    peer_seconds = 0.0
    last = 0.0
    wake_standbys(0.0)  # the initial standbys placed themselves one by one while the peers joined
    series: dict[str, list[float]] = {"t_h": [], "ratio": [], "uncovered_layers": [], "migrations": [],
                                      "sole_layers": [], "memory_ratio": [],
                                      "flow_t_h": [], "flow": []}  # max flow / bound at each route sample
    ratios: list[float] = []
    route_costs: list[float] = []
    route_hops: list[int] = []
    plan_ms: list[float] = []
    drain_s: list[float] = []
    flow_ratios: list[float] = []
    spread_ratios: list[float] = []
    load_spreads: list[float] = []
    drain_started: dict[str, float] = {}
    sole_counts: list[int] = []
    exposed_counts: list[int] = []
    pair_exposed_counts: list[int] = []

    while events and events[0][0] <= end:
        now, _, kind, pid, gen = heapq.heappop(events)
        if tracer is not None and now >= start:  # what the events before this one left served, since the last
            tracer.observe(max(last, start), (sum(swarm.online_thr), swarm.gpu_uncovered, len(peers), swarm.uncovered),
                           bool(swarm.gpu_uncovered),
                           lambda: _placement([q for q in peers.values() if q.served is not None], cfg.growing_share),
                           num_layers, lambda: sum(q.thr * q.k for q in peers.values()) / num_layers, swarm.uncovered)
        if brancher is not None and now >= brancher.next_at:
            branch_here(now)
        dt = now - last
        if swarm.uncovered:
            uncovered_time += dt
            uncovered_layer_time += dt * swarm.uncovered
        elif swarm.gpu_uncovered:
            standby_only_time += dt
        peer_seconds += dt * len(peers)
        standby_seconds += dt * len(standbys)
        last = now
        p = peers.get(pid)
        if kind == "measure":  # warm-up over: count from here
            warmup_moves = migrations
            joins = departures = migrations = routes_failed = drains = drains_timed_out = standby_moves = 0
            moves_from_memory = checks_as_reactions = refills_past_downloads = 0
            uncovered_time = uncovered_layer_time = peer_seconds = standby_only_time = standby_seconds = 0.0
            for values in (ratios, route_costs, route_hops, plan_ms, drain_s, flow_ratios, spread_ratios,
                           load_spreads, sole_counts, exposed_counts, pair_exposed_counts):
                values.clear()
            swarm.gaps_opened = 0
        elif kind == "arrive":
            admit(draw_peer(pop, next_index), now, instant=False)
            next_index += 1
            joins += 1
            push(now + pop.expovariate(cfg.peers * leave_rate), "arrive")
        elif kind == "depart" and p is not None and not p.draining:
            departures += 1
            graceful = pop.random() < cfg.graceful
            if p.serving is not None and graceful:
                drains += 1
                p.draining, p.drain_deadline = True, now + cfg.drain_max_s
                drain_started[pid] = now
                swarm.place(p, -1)  # leaves balancing at once: others see its layers thin
                swarm.stay(p.serving, p, -1)
                if may_leave(p, now):
                    push(now, "drained", pid)
                else:
                    push(p.drain_deadline, "drained", pid)
                    push(now + THIN_GRACE_S, "drained", pid)
                    maybe_react(now, 0.0)
            else:
                if brancher is not None and p.served is not None and brancher.crash_opens_window(now):
                    branch_here(now)
                # Drawn here, not in leave(), so the trace can say it: until then no peer can react (sim_dips).
                seen = cfg.vanished_seen_s if vanish.random() < cfg.vanished_share else CRASH_SEEN_S
                if tracer is not None:
                    tracer.cause("drained" if graceful else "crash", f"{pid} k={p.k} {p.served} seen {seen:g} s")
                leave(p, now, seen)
            wake_standbys(now)
        elif kind == "expire":
            swarm.place(expiring.pop(pid), -1)  # the view no longer shows it: its layers look thin
            pushed = pid in pushed_crashes
            pushed_crashes.discard(pid)
            maybe_react(now, 0.0, pushed)
            wake_standbys(now, pushed)
        elif kind == "drained" and p is not None and p.draining:
            if now < p.drain_deadline and not may_leave(p, now):
                continue
            drains_timed_out += now >= p.drain_deadline and not swarm.covered_without(p)
            drain_s.append(now - drain_started.pop(pid))
            if tracer is not None:
                tracer.cause("drained", f"{pid} k={p.k} {p.served}")
            leave(p, now)
            wake_standbys(now)
        elif kind == "online" and p is not None and gen == p.generation:
            go_online(p)
            wake_standbys(now)
            wake_drainers(now)
        elif kind == "gpu_layer" and p is not None and gen == p.generation and p.to_load:
            serve_layer(p, now)
        elif kind == "load_starts" and p is not None and gen == p.generation and p.leaving is not None:
            if tracer is not None:
                tracer.cause(p.leaving_cause, f"{p.peer_id} k={p.k} {p.leaving} -> {p.layers} (its load starts)")
            stop_serving_old(p)
            wake_standbys(now)
        elif kind == "react":
            if not urgent():
                continue
            candidates = [q for q in peers.values() if not q.loading and not q.draining]
            rng.shuffle(candidates)
            delay, readings = react_delays(candidates, now)
            candidates.sort(key=lambda q: delay[q.peer_id])
            for q in candidates:
                if (0 not in swarm.counted and not (cfg.thin and min(swarm.thr) < swarm.thin_limit())
                        and not dark_but_for_downloads()):
                    break  # every gap and thin layer has a server loading it (not by download)
                if react_move(q, now, delay[q.peer_id], candidates, delay, readings):
                    migrations += 1
                    if not cfg.fast_fill:
                        break
        elif kind == "balance" and p is not None:
            push(now + rng.uniform(0.5, 1.5) * cfg.balance_period_s, "balance", pid)
            if p.loading or p.draining:
                continue  # still loading: judge the range once it serves
            if cfg.periodic_leaves_gaps_to_reactions and view_shows_a_gap():
                # Decided as a reaction: after p's react delay, in its place among the deciders.
                candidates = [q for q in peers.values() if not q.loading and not q.draining]
                push(now + react_delays(candidates, now)[0][pid], "react_check", pid, p.generation)
                checks_as_reactions += 1
                continue
            if cfg.pre_read in ("silent", "go") and now >= p.prefetched_at:
                # It reads the target into memory first, announcing nothing, and decides again after.
                target = try_move(p, now, plan_only=True)
                if target is not None:
                    p.pre_reading, p.pre_read_round = target, p.pre_read_round + 1
                    push(now + p.k * move_load_s(p, now), "pre_read_done", pid, p.pre_read_round)
                continue
            if try_move(p, now):
                migrations += 1
                wake_standbys(now)
                if cfg.thin:
                    maybe_react(now, 0.0)  # its old layers may be thin while it loads: others see it
        elif kind == "react_check" and p is not None and gen == p.generation and not p.loading and not p.draining:
            # A periodic check that saw a gap decides now, as a reaction (peer/balancer.py balance_loop).
            candidates = [q for q in peers.values() if not q.loading and not q.draining]
            if react_move(p, now, 0.0, candidates, *react_delays(candidates, now)):
                migrations += 1
        elif kind == "pre_read_done" and p is not None and p.pre_reading is not None and gen == p.pre_read_round:
            warm, p.pre_reading = p.pre_reading, None
            if p.loading or p.draining:
                continue
            if cfg.pre_read == "go":  # the move decided before the read, if p's layers keep another server
                moved = all(swarm.staying_n[layer] > 1 for layer in range(p.layers.start, p.layers.end))
                if moved:
                    commit_move(p, now, warm, 0.0, False, "move_strength", warm)
            else:
                moved = try_move(p, now, warm=warm) is not None
            if moved:
                migrations += 1
                wake_standbys(now)
                if cfg.thin:
                    maybe_react(now, 0.0)
        elif kind == "standby_round":
            standby_round(now)
        elif kind == "standby_online":
            sb = standbys.get(pid)
            if sb is not None and gen == sb.generation:
                sb.serving = sb.layers
                swarm.serve_standby(sb.serving, +1)
        elif kind == "standby_layer":
            sb = standbys.get(pid)
            if sb is not None and gen == sb.generation and sb.to_load:
                layer = sb.to_load.pop(0)
                swarm.serve_standby(LayerRange(layer, layer + 1), +1)
                sb.arrived.append(layer)
                if not sb.to_load:  # all there: it serves its window (counted layer by layer already)
                    sb.serving, sb.arrived = sb.layers, []
                    swarm.serve_standby(sb.serving, +1)
                    for layer in range(sb.layers.start, sb.layers.end):
                        swarm.serve_standby(LayerRange(layer, layer + 1), -1)
        elif kind == "metric":
            if cfg.check_arrays:
                fresh = recount(num_layers, peers.values(), expiring.values(), standbys.values())
                assert not array_mismatches(swarm, fresh), (now, array_mismatches(swarm, fresh))
            bound = sum(q.thr * q.k for q in peers.values()) / num_layers
            ratio = (min(swarm.online_thr) if not swarm.gpu_uncovered else 0.0) / bound if bound else 0.0
            ratios.append(ratio)
            series["t_h"].append(now / per_hour)
            series["ratio"].append(round(ratio, 4))
            series["uncovered_layers"].append(swarm.uncovered)
            series["migrations"].append(warmup_moves + migrations)  # cumulative over the whole run
            series["sole_layers"].append(swarm.staying_n.count(1))
            series["memory_ratio"].append(round(sum(q.k for q in peers.values() if not q.draining) / num_layers, 4))
            exposed_counts.append(sum(1 for n, ready in zip(swarm.staying_n, swarm.standby_n) if n <= 1 and not ready))
            pair_exposed_counts.append(sum(1 for n, ready in zip(swarm.staying_n, swarm.standby_n) if n == 2 and not ready))
            sole_counts.append(sum(1 for q in peers.values() if not q.draining and q.served is not None
                                   and 1 in swarm.staying_n[q.served.start:q.served.end]))
        elif kind == "route":
            serving = [q for q in peers.values() if q.served is not None]  # a peer loading by layer: what it has
            records = {
                q.peer_id: PeerRecord(q.peer_id, "sim", q.served, PeerState.DRAINING if q.draining else PeerState.ONLINE,
                                      q.thr * (cfg.growing_share if q.growing else 1.0), free_pages=100)
                for q in serving
            }
            view = SwarmView("sim", num_layers, records, {q: peers[q].rtt for q in records})
            # While nobody serves some layer, or only standbys that stream nothing (CPUs), the max flow is
            # 0, and so is the sample: skipping it, as before 2026-11-30, reported the swarm's good moments only.
            if swarm.uncovered or (swarm.gpu_uncovered and not cfg.standby_stream_ratio):
                flow, spread, spread_load = 0.0, 0.0, 0.0
            elif swarm.gpu_uncovered:
                # Standbys streaming their dark layers carry the flow there. Spread routes (and their load,
                # not sampled) stay 0 here, as without streaming: they model the GPU peers' routes.
                hosted = [(sb, peers[sb.peer_id]) for sb in standbys.values() if sb.served is not None]
                flow = _streamed_flow(serving, hosted, swarm.online_n, num_layers, cfg)
                spread, spread_load = 0.0, 0.0
            else:
                flow, spread, spread_load = _flows(serving, num_layers, cfg.growing_share)
            bound = sum(q.thr * q.k for q in peers.values()) / num_layers
            if cfg.snapshots and now >= start and len(flow_ratios) % SNAPSHOT_EVERY == 0:
                _write_snapshot(Path(cfg.snapshots), now, num_layers, serving, cfg.growing_share)
            flow_ratios.append(flow / bound)
            series["flow_t_h"].append(now / per_hour)
            series["flow"].append(round(flow / bound, 4))
            spread_ratios.append(spread / bound)
            if not swarm.gpu_uncovered:
                load_spreads.append(spread_load)
            t0 = time.perf_counter()
            try:
                route = plan_route(view)
            except NoRouteError:
                routes_failed += 1
                continue
            plan_ms.append((time.perf_counter() - t0) * 1e3)
            route_costs.append(route_cost(view, route))
            route_hops.append(len(route))

    measured = end - start
    hours = measured / per_hour
    mean_peers = peer_seconds / measured if measured else len(peers)
    ordered = sorted(ratios)

    def mean(values: list[float]) -> float | None:
        return sum(values) / len(values) if values else None

    if tracer is not None:
        tracer.finish(end)
    if in_branch[0]:
        os._exit(0)
    return SimResult(
        config=asdict(cfg),
        num_layers=num_layers,
        coverage_time_fraction=1.0 - uncovered_time / measured if measured else 1.0,
        uncovered_layer_time_fraction=uncovered_layer_time / (measured * num_layers) if measured else 0.0,
        bottleneck_vs_bound_mean=sum(ratios) / len(ratios) if ratios else 0.0,
        bottleneck_vs_bound_p10=ordered[len(ordered) // 10] if ordered else 0.0,
        migrations_per_peer_hour=migrations / (mean_peers * hours) if hours else 0.0,
        joins=joins,
        departures=departures,
        migrations=migrations,
        moves_from_memory=moves_from_memory,
        checks_as_reactions=checks_as_reactions,
        refills_past_downloads=refills_past_downloads,
        drains=drains,
        drains_timed_out=drains_timed_out,
        drain_s_mean=mean(drain_s),
        flow_vs_bound_mean=mean(flow_ratios),
        spread_vs_bound_mean=mean(spread_ratios),
        load_spread_mean=mean(load_spreads),
        route_cost_s_mean=mean(route_costs),
        route_hops_mean=mean([float(h) for h in route_hops]),
        route_plan_ms_mean=mean(plan_ms),
        routes_failed=routes_failed,
        optimum_low_vs_bound=bracket.low / initial_bound,
        optimum_high_vs_bound=bracket.high / initial_bound,
        sole_servers_mean=mean([float(n) for n in sole_counts]) or 0.0,
        gaps_opened=swarm.gaps_opened,
        standby_only_time_fraction=standby_only_time / measured if measured else 0.0,
        standbys_mean=standby_seconds / measured if measured else 0.0,
        standby_moves=standby_moves,
        wall_s=time.perf_counter() - wall0,
        exposed_layers_mean=mean([float(n) for n in exposed_counts]) or 0.0,
        pair_exposed_layers_mean=mean([float(n) for n in pair_exposed_counts]) or 0.0,
        series=series,
    )


def _balance_arrays(swarm: SwarmArrays, k: int, cfg: SimConfig, counts: list[int] | None) -> tuple[list[float], list[int] | None]:
    """(per-layer throughput, counts) a peer of k layers balances on (shared lists: copy before changing)."""
    if not cfg.tiered:
        return swarm.thr, counts
    return swarm.at_least(k), counts


def _leave_out(others: list[float], counted: list[int] | None, layers: Iterable[int], thr: float) -> None:
    """Take a peer of per-layer throughput `thr` off `layers` of the arrays a peer balances on (in place); a layer
    left with no count or no throughput holds exactly 0, which means nobody."""
    for layer in layers:
        others[layer] = max(0.0, others[layer] - thr)
        if counted is not None:
            counted[layer] -= 1
        if others[layer] < 1e-9 or (counted is not None and not counted[layer]):
            others[layer] = 0.0


def _crossing(swarm: SwarmArrays, k: int, cfg: SimConfig) -> list[float] | None:
    """The throughput crossing each boundary that a peer of k layers ranks windows by (shared: copy
    before changing it); None with --no-stagger."""
    if not cfg.stagger:
        return None
    return swarm.crossing_at_least(k if cfg.tiered else 1)


def _write_snapshot(path: Path, now: float, num_layers: int, serving: list[SimPeer], growing_share: float) -> None:
    """Append the serving placement (what _flows takes) as one JSON line, for benchmarks/sim_fragility.py."""
    placed = _placement(serving, growing_share)
    with path.open("a") as out:
        out.write(json.dumps({"t_s": now, "num_layers": num_layers, "spans": [[s.start, s.end] for s, _ in placed],
                              "capacities": [c for _, c in placed]}) + "\n")


def _placement(serving: list[SimPeer], growing_share: float) -> list[tuple[LayerRange, float]]:
    """(served layers, layer-tokens/s) per serving peer; one still loading part of its window counts at
    `growing_share` of its capacity (SimConfig)."""
    return [(q.served, q.thr * q.k * (growing_share if q.growing else 1.0)) for q in serving]


def standby_stream_entries(span: LayerRange, gpu_servers: list[int],
                           capacity: float) -> list[tuple[LayerRange, float]]:
    """Max-flow entries of a standby serving `span` that streams, every step, its m layers no GPU peer
    serves (gpu_servers 0): a streamed step is the weights' copy whatever the batch, so it carries
    `capacity` (R x its host's thr x k) / m tokens/s through each of them. One entry per contiguous run
    of them, (run, capacity x its length / m); none where a GPU peer serves (clients use it only there)."""
    runs: list[list[int]] = []  # [start, end) of each run of dark layers
    for layer in range(span.start, span.end):
        if gpu_servers[layer]:
            continue
        if runs and runs[-1][1] == layer:
            runs[-1][1] = layer + 1
        else:
            runs.append([layer, layer + 1])
    dark = sum(end - start for start, end in runs)
    return [(LayerRange(start, end), capacity * (end - start) / dark) for start, end in runs]


def _streamed_flow(serving: list[SimPeer], hosted: list[tuple[SimPeer, SimPeer]], gpu_servers: list[int],
                   num_layers: int, cfg: SimConfig) -> float:
    """Max flow of the serving placement plus the serving standbys (`hosted`: (standby, its host)),
    each streaming its dark layers (standby_stream_entries); a host whose standby streams some layer
    keeps 1 - standby_stream_host_slowdown of its capacity. The GPU peers' bound is left as it is."""
    streams: list[tuple[LayerRange, float]] = []
    slowed: set[str] = set()
    for sb, host in hosted:
        entries = standby_stream_entries(sb.served, gpu_servers, cfg.standby_stream_ratio * host.thr * host.k)
        if entries:
            streams += entries
            slowed.add(host.peer_id)
    kept = 1.0 - cfg.standby_stream_host_slowdown
    placed = [(span, cap * kept if q.peer_id in slowed else cap)
              for q, (span, cap) in zip(serving, _placement(serving, cfg.growing_share))]
    return max_flow_of(placed + streams, num_layers)


def _flows(serving: list[SimPeer], num_layers: int, growing_share: float = 1.0) -> tuple[float, float, float]:
    """(max flow of the serving placement, flow the spread split carries, its max / mean utilisation).

    A peer still loading part of its window counts at `growing_share` of its capacity (SimConfig).
    """
    placed = _placement(serving, growing_share)
    spans, caps = [span for span, _ in placed], [cap for _, cap in placed]
    flow = max_flow_of(placed, num_layers)
    full_at = full_flows(spans, caps, flow_weights(spans, caps, num_layers), num_layers)
    per_flow = [1.0 / f for f in full_at]  # each peer's utilisation per unit of flow
    spread = min(full_at)  # the flow at which the first peer is full
    return flow, spread, max(per_flow) / (sum(per_flow) / len(per_flow))


def main(argv: list[str] | None = None) -> SimResult:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", type=int, default=1000)
    ap.add_argument("--hours", type=float, default=6.0, help="simulated hours measured (after the warm-up)")
    ap.add_argument("--warmup-hours", type=float, default=0.0,
                    help="simulated hours before measuring starts (report the steady state, not the start)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", choices=("joins", "profile"), default="joins",
                    help="where the first peers sit at t = 0: joins: placed one by one by the join rule; profile: "
                         "at the near-optimal profile placement (benchmarks/sim_optimum.py), an oracle's start "
                         "no peer's rule builds (use a short --warmup-hours to measure what it is worth under churn)")
    ap.add_argument("--churn", type=float, default=0.10, help="fraction of peers leaving per hour")
    ap.add_argument("--redundancy", type=float, default=2.0, help="sum of layers peers hold / model layers")
    ap.add_argument("--layers", type=int, default=None, help="model layers (overrides --redundancy)")
    ap.add_argument("--quality", type=float, default=DEFAULT_QUALITY)
    ap.add_argument("--load-s-per-layer", type=float, default=LOAD_S_PER_LAYER,
                    help="seconds a joining peer (or its standby) takes to fetch and load one layer")
    ap.add_argument("--move-load-s-per-layer", type=float, default=None,
                    help="seconds per layer when a running peer or standby moves (default: --load-s-per-layer; "
                         "lower models peers that prefetched the model to disk)")
    ap.add_argument("--refill-load-s-per-layer", type=float, default=None,
                    help="a sensitivity: seconds per layer of a GPU peer's move made reacting to a gap or thin layer, "
                         "once prefetched (as if read from memory; default: as --move-load-s-per-layer)")
    ap.add_argument("--pre-read", choices=("never", "silent", "go", "announced"), default="never",
                    help="a GPU peer's periodic move reads its target's files into memory, serving its old range on, "
                         "before it frees it: silent: before announcing it, then decides again (swarm-peer serve "
                         "--pre-read); go: before announcing it, then goes without deciding again; announced: after announcing "
                         "it; never (the peer's default)")
    ap.add_argument("--warm-load-s-per-layer", type=float, default=0.25,
                    help="with --pre-read: seconds per layer of the load after the read (the page cache's speed)")
    ap.add_argument("--prefetch-s", type=float, default=0.0,
                    help="with --move-load-s-per-layer: seconds after a joiner first serves until its moves load that fast "
                         "(its background prefetch of the model)")
    ap.add_argument("--balance-period", type=float, default=BALANCE_PERIOD_S, help="mean seconds")
    ap.add_argument("--graceful", type=float, default=0.0, help="share of departures that drain first")
    ap.add_argument("--drain-max", type=float, default=DRAIN_MAX_S, help="seconds a drain may wait")
    ap.add_argument("--no-react", action="store_true", help="peers wait for their period even when a layer has no ONLINE server")
    ap.add_argument("--sole-discount", type=float, default=SOLE_DISCOUNT,
                    help="strength of a layer with one server, as a share of its throughput (1: no discount)")
    ap.add_argument("--no-flow-join", action="store_true",
                    help="joiners take the weakest window, not one holding the max flow's bottleneck")
    ap.add_argument("--no-fast-fill", action="store_true",
                    help="a gap is filled by one random peer, not by the fastest loaders in parallel")
    ap.add_argument("--untiered", action="store_true",
                    help="peers weigh every peer, not only those holding at least as many layers (the rule before)")
    ap.add_argument("--no-stagger", action="store_true",
                    help="joins and moves rank windows by their layers alone, not also by the throughput crossing their "
                         "inner boundaries, so they abut their neighbours (the rule before the nineteenth session)")
    ap.add_argument("--standby-share", type=float, default=0.0,
                    help="share of peers that also run a standby in host memory (swarm-peer serve --standby)")
    ap.add_argument("--standby-stream-ratio", type=float, default=0.0,
                    help="standbys stream their weights through their host's GPU (swarm-peer serve --stream-weights): "
                         "a resident layer's step over a streamed one's there (benchmarks/bench_streamed_standby.py); "
                         "a standby carries this times its host's per-layer rate, split over the layers only it serves; "
                         "only the max-flow sample counts it (0: standbys carry nothing)")
    ap.add_argument("--standby-stream-host-slowdown", type=float, default=0.0,
                    help="with --standby-stream-ratio: the share of its own capacity a host loses while its standby "
                         "streams (the GPU and memory bandwidth they share), in [0, 1)")
    ap.add_argument("--route-period", type=float, default=ROUTE_PERIOD_S,
                    help="simulated seconds between route and max-flow samples (shorter: a steadier mean, slower)")
    ap.add_argument("--no-guard-discount", action="store_true",
                    help="discount sole-served layers even where a standby guards them (the rule before: GPU peers ignore standbys)")
    ap.add_argument("--no-flow-moves", action="store_true",
                    help="running peers move only by should_move's strength rule, never for the max flow (the rule before)")
    ap.add_argument("--ungated-strength-moves", action="store_true",
                    help="every strength move found at a periodic balance check goes, not only one that gives a layer "
                         "with at most one server a second or raises the max flow (routing.move_gate; the rule before)")
    ap.add_argument("--flow-move-search", choices=("never", "always"), default="always",
                    help="whether a flow move tries every window holding the first short layer and may cut the shortfall by "
                         "routing.flow_move.SHORTFALL_CUT instead of reaching the aim: always (as the peer does), or never "
                         "(only the lowest-total window, the rule before the twenty-eighth session)")
    ap.add_argument("--flow-move-gain", type=float, default=None,
                    help="a fixed share by which every flow move must raise the swarm's max flow (default: "
                         "routing.flow_move_gain, --mover-share-gain times the mover's capacity share within 0.05-1%%; 0.01 is the rule before)")
    ap.add_argument("--mover-share-gain", type=float, default=MOVER_SHARE_GAIN,
                    help="without --flow-move-gain: how many times its capacity share a flow move must raise the max flow "
                         "(routing.MOVER_SHARE_GAIN; 2 with --flow-move-cooldown 4500 is the rule before)")
    ap.add_argument("--flow-move-cooldown", type=float, default=FLOW_MOVE_COOLDOWN_S,
                    help="seconds after its last move before a peer may make a flow move (routing.FLOW_MOVE_COOLDOWN_S)")
    ap.add_argument("--strength-move-cooldown", type=float, default=0.0,
                    help="seconds after its last move before a periodic check's strength move may go (reactions "
                         "never wait; 0: no wait, the peer's rule)")
    ap.add_argument("--strength-wait-all", action="store_true",
                    help="--strength-move-cooldown holds every periodic strength move, also one that gives a layer "
                         "with one server its second (by default those go at once)")
    ap.add_argument("--standby-moves-in-use", action="store_true",
                    help="a standby may move while it is some layer's last live server (the rule before)")
    ap.add_argument("--small-first-always", action="store_true",
                    help="the fewest-layer peers refill first even when every layer has a GPU server, some thin (the rule before)")
    ap.add_argument("--gap-delay-per-layer-held", action="store_true",
                    help="on a gap every peer waits 0.5 s per layer it holds, so the smallest wait 2 s (the rule "
                         "before the thirty-fifth session; now they wait one step, the others a step per layer more)")
    ap.add_argument("--mover-stops-at-decision", action="store_true",
                    help="a mover stops serving its old range when it decides and loads after its react wait alone "
                         "(the simulator before the thirty-sixth session; the peer serves on through the wait and "
                         f"the move's {MOVE_CONFIRM_S:g}-s confirmation, then frees it and loads)")
    ap.add_argument("--standby-pair-weight", type=float, default=0.0,
                    help="standbys weigh an unguarded layer two peers serve this much (a sole-served one: 1)")
    ap.add_argument("--standby-by-layer", action="store_true",
                    help="a loading standby serves each layer as it arrives, the most exposed first")
    ap.add_argument("--standby-idle-moves", action="store_true",
                    help="a standby that guards nothing where it is moves for one exposed layer, not STANDBY_MARGIN of its window")
    ap.add_argument("--exposing-peers-react-as-soon", action="store_true",
                    help="a reacting peer whose leaving would leave one of its layers to a single unguarded server decides "
                         "as soon as the others of its size, not a step later (the rule before)")
    ap.add_argument("--downloaders-react-as-soon", action="store_true",
                    help="with --prefetch-s: a reacting peer whose move would download its layers (its prefetch not "
                         "done) decides by its size alone, not after every peer that loads from disk (the rule before)")
    ap.add_argument("--confirm-every-reaction", action="store_true",
                    help="every reacting peer confirms its move for MOVE_CONFIRM_S (the rule before the forty-third "
                         "session); default: one that goes first among the peers that may decide with it on its layers "
                         "goes at once (peer/balancer.py must_confirm)")
    ap.add_argument("--periodic-takes-gaps", action="store_true",
                    help="a periodic balance check whose view shows a layer no GPU peer serves decides at once (the "
                         "rule before the forty-fifth session); default: it leaves the gap to the reaction, which "
                         "orders its deciders (peer/balancer.py decides such a check as a reaction)")
    ap.add_argument("--react-first-step", action="store_true",
                    help="the first deciders of a reaction (the smallest peers on a gap, the largest on thin layers) "
                         "wait one step, 0.5 s (the rule before the forty-fourth session); default: they decide at once")
    ap.add_argument("--serve-by-layer", nargs="?", const="all", choices=("all", "moves"),
                    help="a loading GPU peer serves each layer as it arrives, layers no GPU peer serves first, then the "
                         "thinnest: joiners and movers (all: what the GPU peer does), or movers only (moves: the "
                         "peer before the fifteenth session, whose joins loaded the whole window first)")
    ap.add_argument("--no-coordinated-loads", action="store_true",
                    help="with --serve-by-layer, loaders of one dark stretch ignore each other's announced load "
                         "orders (the rule before the twenty-fifth session: most light the same layers first)")
    ap.add_argument("--downloads-count-as-cover", action="store_true",
                    help="a loader that downloads its layers (a joiner, a mover whose prefetch is not done) counts on its "
                         "whole target for reactions and load orders (the rule before the forty-sixth session); default: "
                         "a reaction counts one whose target holds a layer no GPU peer serves only on the layers it has "
                         "(the rest are dark), and its load order counts for no other loader")
    ap.add_argument("--orders-while-confirming", action="store_true",
                    help="with --serve-by-layer, a mover's load order counts for the next loader from its decision on, "
                         "its move's confirmation included (the rule before the forty-fifth session); default: from "
                         "its load start, when the peer announces it")
    ap.add_argument("--growing-share", type=float, default=1.0,
                    help="with --serve-by-layer, the share of its capacity a GPU peer gets while part of its window "
                         "is loaded: it decodes eagerly until its CUDA graphs are captured (1: as fast as loaded; on the "
                         "H200, docs/performance.md, eager decode is ~1/8 of graphs for 7B-sized layers, ~1/4 for "
                         "70B-sized ones; slower GPUs lose less)")
    ap.add_argument("--vanished-share", type=float, default=0.5,
                    help="share of the abrupt departures that are vanished hosts (a closed laptop: no stream closes), "
                         "seen after --vanished-seen-s; the rest are dead processes, seen after CRASH_SEEN_S = 1.5 s")
    ap.add_argument("--vanished-seen-s", type=float, default=VANISHED_SEEN_S,
                    help="seconds until a vanished host's record leaves the view (3.5: the client's stall probe and the "
                         "peers' probe; 6.5: both with 2-s waits, before the thirty-fifth session; 48: the client before the stall probe, 30-s step timeout and 15-s re-dial, "
                         "so the record expires first)")
    ap.add_argument("--watch-period", type=float, default=WATCH_PERIOD_S,
                    help="seconds between a peer's (and a standby's) reads of the view, +-25%%: how soon after a layer "
                         "turns thin or a drainer's sole-served, or (--no-crash-push) a crash is seen, peers react (the "
                         "peer's --watch-period, default WATCH_PERIOD_S = 5; docs/balancing.md, thirty-third and "
                         "thirty-fourth sessions)")
    ap.add_argument("--no-crash-push", action="store_true",
                    help="a crash the watch saw reaches each peer and standby at its next read of the view, not after "
                         "CRASH_PUSH_S = 1 s (the peer before crash notices, peer/crash_notices.py)")
    ap.add_argument("--no-crash-watch", action="store_true",
                    help="a crashed peer's record counts until it expires (the rule before peer/crash_watch.py)")
    ap.add_argument("--no-thin", action="store_true",
                    help="peers decide at once only on gaps, not thin layers, a drain leaves once covered, and a move may leave its layers thin (the rule before)")
    ap.add_argument("--throughput-only", action="store_true", help="balance on throughput alone (no discount of sole-served layers)")
    ap.add_argument("--trace", type=Path, default=None,
                    help="write the served max flow at every change of the measured hours, with the event that "
                         "caused it, to this JSONL file (benchmarks/sim_dips.py reads it; slower: thousands of max "
                         "flows per simulated hour at 1,000 peers)")
    ap.add_argument("--snapshots", type=Path, default=None,
                    help="append the serving placement of every 10th measured route sample to this JSONL file "
                         "(benchmarks/sim_fragility.py reads it: how deep one crash cuts the max flow)")
    ap.add_argument("--branch", action="append", default=[], metavar="SPEC",
                    help="fork the run every --branch-every seconds of its measured hours and run this branch on for "
                         "--branch-horizon seconds from there, with its overrides: NAME:KEY=VALUE,... (KEY a SimConfig "
                         "field or an upper-case constant, e.g. notices:CRASH_PUSH_S=0.5); repeat for more branches; "
                         "needs --trace; compare with python -m benchmarks.sim_branches TRACE")
    ap.add_argument("--branch-every", type=float, default=600.0, help="seconds between branch points (default 600)")
    ap.add_argument("--branch-horizon", type=float, default=600.0, help="seconds each branch runs (default 600)")
    ap.add_argument("--branch-at-crashes", action="store_true",
                    help="start the branches at every crash of a serving peer in the measured hours instead of every "
                         "--branch-every seconds: each branch from the moment of the crash, for what a rule does about it")
    ap.add_argument("--json", type=Path, default=None, help="default: benchmarks/results/swarm_<peers>p_<hours>h_s<seed>.json")
    ap.add_argument("--plot", type=Path, default=None, help="PNG of coverage/bottleneck over time")
    a = ap.parse_args(argv)
    if a.refill_load_s_per_layer is not None and not a.refill_load_s_per_layer > 0:
        ap.error(f"--refill-load-s-per-layer is seconds per layer, > 0, got {a.refill_load_s_per_layer}")
    if not a.watch_period > 0:
        ap.error(f"--watch-period is seconds between reads of the view, > 0, got {a.watch_period}")
    if not 0 <= a.vanished_share <= 1:
        ap.error(f"--vanished-share is a share of the abrupt departures in [0, 1], got {a.vanished_share}")
    if not 0 < a.growing_share <= 1:
        ap.error(f"--growing-share is a share of capacity in (0, 1], got {a.growing_share}")
    if not a.standby_stream_ratio >= 0:
        ap.error(f"--standby-stream-ratio is a ratio of step times, >= 0, got {a.standby_stream_ratio}")
    if not 0 <= a.standby_stream_host_slowdown < 1:
        ap.error(f"--standby-stream-host-slowdown is a share of the host's capacity in [0, 1), "
                 f"got {a.standby_stream_host_slowdown}")
    if a.branch and a.trace is None:
        ap.error("--branch pairs each branch with the run's trace: add --trace FILE")
    if not (a.branch_every > 0 and a.branch_horizon > 0):
        ap.error(f"--branch-every and --branch-horizon are seconds, > 0, got {a.branch_every} and {a.branch_horizon}")
    cfg = SimConfig(a.peers, a.hours, a.seed, a.churn, a.redundancy, a.layers, a.quality, a.balance_period,
                    load_s_per_layer=a.load_s_per_layer, move_load_s_per_layer=a.move_load_s_per_layer,
                    refill_load_s_per_layer=a.refill_load_s_per_layer,
                    pre_read=a.pre_read, warm_load_s_per_layer=a.warm_load_s_per_layer, start=a.start,
                    prefetch_s=a.prefetch_s,
                    graceful=a.graceful, drain_max_s=a.drain_max, react=not a.no_react,
                    redundancy_aware=not a.throughput_only, sole_discount=a.sole_discount,
                    fast_fill=not a.no_fast_fill, flow_join=not a.no_flow_join, tiered=not a.untiered,
                    stagger=not a.no_stagger,
                    warmup_hours=a.warmup_hours, standby_share=a.standby_share,
                    standby_stream_ratio=a.standby_stream_ratio,
                    standby_stream_host_slowdown=a.standby_stream_host_slowdown, thin=not a.no_thin,
                    guard_discount=not a.no_guard_discount, route_period_s=a.route_period, flow_moves=not a.no_flow_moves,
                    flow_move_search=a.flow_move_search, strength_gate=not a.ungated_strength_moves,
                    flow_move_gain=a.flow_move_gain, flow_move_cooldown_s=a.flow_move_cooldown,
                    strength_move_cooldown_s=a.strength_move_cooldown, strength_wait_all=a.strength_wait_all,
                    mover_share_gain=a.mover_share_gain,
                    crash_watch=not a.no_crash_watch, vanished_share=a.vanished_share,
                    vanished_seen_s=a.vanished_seen_s, watch_period_s=a.watch_period, crash_push=not a.no_crash_push,
                    standby_stays_in_use=not a.standby_moves_in_use,
                    small_first_always=a.small_first_always, gap_delay_from_smallest=not a.gap_delay_per_layer_held,
                    mover_serves_while_waiting=not a.mover_stops_at_decision, standby_pair_weight=a.standby_pair_weight,
                    standby_by_layer=a.standby_by_layer, standby_idle_moves=a.standby_idle_moves,
                    react_clean_first=not a.exposing_peers_react_as_soon,
                    downloaders_react_last=not a.downloaders_react_as_soon,
                    first_skips_confirm=not a.confirm_every_reaction,
                    periodic_leaves_gaps_to_reactions=not a.periodic_takes_gaps, react_first_steps=int(a.react_first_step), serve_by_layer=a.serve_by_layer is not None,
                    coordinated_loads=not a.no_coordinated_loads,
                    orders_from_load_start=not a.orders_while_confirming,
                    downloads_count_as_dark=not a.downloads_count_as_cover,
                    joins_by_layer=a.serve_by_layer == "all", growing_share=a.growing_share,
                    snapshots=None if a.snapshots is None else str(a.snapshots),
                    trace=None if a.trace is None else str(a.trace),
                    branches=tuple(a.branch), branch_every_s=a.branch_every, branch_horizon_s=a.branch_horizon,
                    branch_at_crashes=a.branch_at_crashes)
    try:
        validate([BranchSpec.parse(text) for text in cfg.branches], cfg, sys.modules[__name__])
    except ValueError as e:
        ap.error(str(e))
    result = simulate(cfg)
    print(format_table(result))
    out = a.json or Path(__file__).parent / "results" / f"swarm_{a.peers}p_{a.hours:g}h_s{a.seed}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(asdict(result), indent=1))
    print(f"wrote {out}")
    if a.plot:
        plot(result, a.plot)
        print(f"wrote {a.plot}")
    return result


if __name__ == "__main__":
    main()
