"""Where this peer serves: pick layers on join, and move to the swarm's weakest layers later
(a standby: to the layers one crash would leave dark).

The decisions are pure functions of `routing` (a check's whole decision: `routing.balance_check`);
this file only feeds them fresh views (and the time since its last move, and whether the check is
periodic or a reaction to a hole) and acts on their answers. With --pre-read a periodic check's move
first reads its layers into memory (Placement.pre_read) and is decided again after the read.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from peer.config import DTYPES, PeerConfig
from peer.memory import layers_that_fit
from routing import (
    MoveKind,
    balance_check,
    choose_layers,
    covered_without,
    exposes_on_leaving,
    move_load_order,
    standby_layers,
    standby_load_order,
    urgent_layers,
)
from shards.config import ModelConfig
from swarm.reachability import machine_of
from swarm.types import LayerRange, SwarmView

logger = logging.getLogger(__name__)

# Each wait is the period times a factor in [1 - JITTER, 1 + JITTER], so peers that started
# together do not all re-read the swarm and move at the same moment (herding onto one gap).
JITTER = 0.25
# On seeing such layers a peer waits, then decides on a fresh view (react_delay): peers decide one
# size after another, each step this long per layer of difference, and announce their moves
# (peer/server.py migrate), so the next size sees the layers taken. 0.5 s: a DHT announcement is
# visible to others well within one step (4 vs 8 layers).
REACT_DELAY_PER_LAYER_S = 0.5
# Steps the first deciders wait (the smallest peers on a gap, the largest on thin layers): none. The steps
# are there so that each size sees what the sizes before it took; the first have nobody before them,
# and peers of their own size that share a layer with them confirm their moves (must_confirm). One
# step until the forty-fourth session: every reaction 0.5 s later for nothing (docs/balancing.md).
REACT_FIRST_STEPS = 0
# A move that stepped back because another peer leaves the same layers at the same moment looks
# again after a random wait in this range (seconds), not at the next read of the view. Peers of
# one size woken by the same crash notice (peer/crash_notices.py) decide within milliseconds of
# each other: each sees the other leaving and both step back. At random times one goes first and
# the other then sees its layers taken (the confirmation takes MOVE_CONFIRM_S).
STEP_BACK_RETRY_S = (1.0, 4.0)
# After announcing a move, a peer waits this long and re-reads the swarm before acting on it (peer/moves.py
# migrate): a peer that decided to leave the same layers at the same moment has announced its move by then (one
# DHT store and one get on 127.0.0.1 take milliseconds, across the Internet a few hundred). A reaction skips it
# when it goes first among the peers that may decide with it on its layers (must_confirm).
MOVE_CONFIRM_S = 1.0
# TEST ONLY: "START:END" makes a self-placing peer's first balance check that finds no strength
# move, while its layers have other servers, take that range as its flow move, whatever the
# measured throughputs say. A CPU test of tiny models cannot steer routing.flow_move's choice,
# which turns on throughput differences within measurement noise; with this it puts a peer where
# a flow move once left the only server of a layer next to a gap (tests/test_flow_move_gap.py).
# Read here only (forced_flow_move); unset in any real deployment.
TEST_FLOW_MOVE_ENV = "LAYERSWARM_TEST_FLOW_MOVE"


@dataclass(frozen=True)
class Placement:
    """What the balancer may read and do, handed over by the server (so this file never imports it)."""

    config: PeerConfig
    model_config: ModelConfig
    fetch_view: Callable[[], Awaitable[SwarmView]]
    peer_id: Callable[[], str]
    visible_maddrs: Callable[[], list[str]]  # what we announce: a standby avoids guarding peers on our machine
    layers: Callable[[], LayerRange | None]
    throughput: Callable[[], float]
    # (target, load order or None, the view it was decided on, seconds to confirm) -> False when it stepped back
    # (Moves.migrate)
    migrate: Callable[[LayerRange, Sequence[int] | None, SwarmView | None, float], Awaitable[bool]]
    open_sessions: Callable[[], int]  # sessions open here now (a standby that has any is in use: it stays)
    # (target, halted) -> read target's weights into the page cache until done or halted (Moves.pre_read);
    # None: no pre-reads
    pre_read: Callable[[LayerRange, threading.Event], Awaitable[object]] | None = None
    # Set by a crash notice (peer/crash_notices.py): the watch reads the view now, not at its next period.
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    # The last view read, less the suspects heard of directly that fail our probe: no DHT read (the watch's
    # first look after a crash notice); None before the first read. None: a notice reads the DHT's view.
    heard_view: Callable[[], Awaitable[SwarmView | None]] | None = None
    # Do this peer's moves read their layers from disk (a local checkpoint, or a Hub model's prefetch done:
    # peer/prefetch.py)? False: a move downloads them, several times slower (react_delay's `downloads`).
    loads_from_disk: Callable[[], bool] = lambda: True


async def choose_initial_layers(placement: Placement) -> tuple[LayerRange, list[int]]:
    """The layers to join on, and the order to load (and serve) them in, each as it arrives: for a
    standby the most exposed first (routing.standby_load_order), for a GPU peer gaps and thin
    layers first (routing.move_load_order, as its moves do). A joiner that serves its first layer
    after one layer's load, not the whole window's, refills the hole it joined for minutes sooner:
    balancing counts it there from its first announcement, so nobody else comes to help meanwhile
    (docs/balancing.md, fifteenth session)."""
    cfg = placement.config
    total = placement.model_config.num_layers
    # Streamed weights (--stream-weights) fill host memory; their KV cache is on the device.
    count = cfg.num_layers or layers_that_fit(placement.model_config, DTYPES[cfg.dtype], cfg.weights_device,
                                              0 if cfg.stream_weights else cfg.cache_tokens, cfg.quant,
                                              cfg.quant_group_size)
    view = await placement.fetch_view()
    if cfg.standby:
        layers = standby_layers(view, placement.peer_id(), min(count, total), machines(view, placement))
        assert layers is not None  # a peer without a record always gets a window
        logger.info("standby: chose layers %s (%d of %d), where a crash would leave layers dark",
                    layers, len(layers), total)
        return layers, standby_load_order(view, placement.peer_id(), layers, machines(view, placement))
    layers = choose_layers(view, min(count, total))
    logger.info("chose layers %s (%d of %d) where the swarm is weakest", layers, len(layers), total)
    return layers, move_load_order(view, placement.peer_id(), layers)


async def balance_loop(placement: Placement) -> None:
    cfg = placement.config
    loop = asyncio.get_running_loop()
    decided_on: list[int] = []  # urgent layers already decided on: no early wake for them again
    last_move: float | None = None  # loop time of our last move: flow moves wait FLOW_MOVE_COOLDOWN_S after it
    forced = forced_flow_move()
    while True:
        due = loop.time() + cfg.balance_period * random.uniform(1 - JITTER, 1 + JITTER)
        woke = await _watch_until(placement, due, decided_on)  # a view with new urgent layers, or None
        try:
            view = woke or await placement.fetch_view()
            if woke is None and (dark := view.uncovered_layers(standbys=False)):
                # A gap (layers no GPU peer serves) the watch has not reacted to yet: decided as a reaction, in
                # its place among the deciders (the fastest loaders first, downloaders last), not at once. At
                # once, a slow peer's check (one still downloading the model) could take a whole dark stretch
                # and hold off the fast loaders, which would see it counted there (docs/balancing.md,
                # forty-fifth session).
                woke = view = await _react_after_delay(placement, view, dark, heard=False)
            decided_on = urgent_layers(view)
            since = None if last_move is None else loop.time() - last_move
            unused = forced
            target, forced = _decide(placement, view, since, woke is None, forced)
            if target is not None and woke is None and pre_reads_first(placement, view, target):
                # A periodic move is no hurry: read its layers into memory first, announcing nothing and
                # serving on, then decide again on the swarm of then (a move inside what was read loads
                # at the page cache's speed). A crash notice meanwhile stops the read: gaps come first.
                if not await pre_read_unless_woken(placement, target):
                    continue
                view = await placement.fetch_view()
                decided_on = urgent_layers(view)
                since = None if last_move is None else loop.time() - last_move
                target, forced = _decide(placement, view, since, True, unused)
            if target is not None:
                # Gaps and thin layers first, each served as it arrives (routing.move_load_order).
                order = move_load_order(view, placement.peer_id(), target)
                if await placement.migrate(target, order, view, move_confirm_s(placement, view, woke is None)):
                    last_move = loop.time()
                else:
                    decided_on = []  # stepped back (a peer leaving the same layers, a gap since): look again soon
                    loop.call_later(random.uniform(*STEP_BACK_RETRY_S), placement.wake.set)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("balancing round failed; staying on layers %s", placement.layers())


def _decide(placement: Placement, view: SwarmView, since_last_move_s: float | None, periodic: bool,
            forced: LayerRange | None) -> tuple[LayerRange | None, LayerRange | None]:
    """One balance check on `view` (routing.balance_check): the target to move to or None, and the
    forced flow move still unused (TEST_FLOW_MOVE_ENV)."""
    me = placement.peer_id()
    if me not in view.records:
        return None, forced  # our own record is not visible yet; decide on the next round
    decision = balance_check(view, me, since_last_move_s=since_last_move_s, periodic=periodic,
                             my_throughput=placement.throughput(), quality=placement.config.balance_quality)
    if decision.held is not None:
        logger.info("layers %s are weaker than ours by strength, but moving there would neither give a "
                    "layer with one server a second nor raise the swarm's max flow: staying", decision.held)
    target = decision.target
    if decision.kind is not MoveKind.STRENGTH and forced is not None and covered_without(view, me):
        target, forced = forced, None
    if target is not None and decision.kind is not MoveKind.STRENGTH:
        logger.info("the swarm's max flow runs dry in %s: moving there from %s cuts what it lacks for a "
                    "higher flow (routing.flow_move)", target, placement.layers())
    return target, forced


def pre_reads_first(placement: Placement, view: SwarmView, target: LayerRange) -> bool:
    """Does a periodic move to `target` read it into memory first (--pre-read, off by default)? Not when a layer of it
    has no GPU server: a gap's first layer must light at once, not after the whole target's read."""
    if placement.pre_read is None or not placement.config.pre_read:
        return False
    return not any(target.start <= layer < target.end for layer in view.uncovered_layers(standbys=False))


async def pre_read_unless_woken(placement: Placement, target: LayerRange) -> bool:
    """Read `target` into memory (placement.pre_read); True once read, False when a crash notice
    (placement.wake, left set for the next watch) came first and stopped it."""
    assert placement.pre_read is not None
    logger.info("moving to layers %s would help the swarm: reading their weights into memory first while "
                "serving layers %s, then deciding again (--no-pre-read: off)", target, placement.layers())
    halted = threading.Event()
    reading = asyncio.ensure_future(placement.pre_read(target, halted))
    woken = asyncio.ensure_future(placement.wake.wait())
    try:
        await asyncio.wait({reading, woken}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        halted.set()  # the read stops at its next chunk (milliseconds) if it is still going
        woken.cancel()
        await asyncio.gather(reading, woken, return_exceptions=True)
    if placement.wake.is_set():
        logger.info("a crash notice came while reading layers %s: deciding on it first", target)
        return False
    reading.result()  # a read that failed fails the round (the loop logs it); shards.pre_read never raises
    return True


def forced_flow_move() -> LayerRange | None:
    """The flow move TEST_FLOW_MOVE_ENV forces (tests only), or None when it is unset."""
    value = os.environ.get(TEST_FLOW_MOVE_ENV, "")
    if not value:
        return None
    target = LayerRange.parse(value)
    logger.warning("TEST ONLY: %s=%s: the first flow move goes to layers %s", TEST_FLOW_MOVE_ENV, value, target)
    return target


async def _sleep_or_wake(placement: Placement, seconds: float) -> bool:
    """Sleep `seconds`, or less when a crash notice sets `placement.wake`; True when one did."""
    try:
        await asyncio.wait_for(placement.wake.wait(), seconds)
    except asyncio.TimeoutError:
        pass
    woken = placement.wake.is_set()
    placement.wake.clear()
    return woken


def _watch_wait(placement: Placement) -> float:
    return placement.config.watch_period * random.uniform(1 - JITTER, 1 + JITTER)


async def _watch_until(placement: Placement, due: float, decided_on: list[int]) -> SwarmView | None:
    """Sleep until `due`, re-reading the view every watch period (or when a crash notice wakes us);
    return early a view with new urgent layers."""
    loop = asyncio.get_running_loop()
    period = placement.config.watch_period
    failing = False  # the last read failed: say so once per streak, not every watch period
    while (left := due - loop.time()) > 0:
        woken = await _sleep_or_wake(placement, min(_watch_wait(placement), left))
        try:
            heard = await _heard_news(placement, decided_on) if woken else None
            view = heard if heard is not None else await placement.fetch_view()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Said once: a DHT that stops answering leaves this peer blind to gaps until its next
            # periodic check (minutes), and without this line its log would not say why it did not react.
            if not failing:
                logger.warning("reading the swarm's view failed (%s: %s); gaps are not seen until a read "
                               "succeeds, retrying every %.0f s", type(exc).__name__, exc, period)
            failing = True
            continue
        if failing and heard is None:
            logger.info("reading the swarm's view works again")
            failing = False
        if urgent := _new_urgent(placement, view, decided_on):
            return await _react_after_delay(placement, view, urgent, heard=heard is not None)
    return None


async def _react_after_delay(placement: Placement, view: SwarmView, urgent: list[int], heard: bool) -> SwarmView:
    """`view` shows `urgent` layers: wait this peer's react delay (after the peers that should go first), then
    the view to decide on, read fresh (`view` itself if that read fails). `heard`: `view` is our last one less
    the peer a crash notice told of."""
    delay = _my_react_delay(placement, view)
    logger.info("%d layers between %d and %d have no ONLINE server or are thin (a peer is draining, "
                "gone or moving%s): deciding now (in %.1f s, after the peers that should go first)",
                len(urgent), urgent[0], urgent[-1],
                "; seen on our last view, less the peer we were told of" if heard else "", delay)
    await asyncio.sleep(delay)
    try:
        return await placement.fetch_view()
    except asyncio.CancelledError:
        raise
    except Exception:
        return view


async def _heard_news(placement: Placement, decided_on: list[int]) -> SwarmView | None:
    """Woken by a crash notice: the last view read less the suspects heard of that fail our probe
    (Placement.heard_view), when it shows new urgent layers. The react delay then starts without a DHT
    read (a probe's round trip, not a read's several), and the decision after it reads the DHT anyway.
    None: read the DHT's view (nothing new here, as for a notice about a peer our last view did not list)."""
    if placement.heard_view is None:
        return None
    heard = await placement.heard_view()
    return heard if heard is not None and _new_urgent(placement, heard, decided_on) else None


def _new_urgent(placement: Placement, view: SwarmView, decided_on: list[int]) -> list[int]:
    """`view`'s urgent layers when they are news: not decided on yet, with our own record in it to react from;
    else none."""
    urgent = urgent_layers(view)
    return urgent if urgent and urgent != decided_on and placement.peer_id() in view.records else []


def _my_react_delay(placement: Placement, view: SwarmView) -> float:
    """This peer's react_delay on `view`."""
    mine = placement.layers()
    return react_delay(view, len(mine) if mine is not None else 1,
                       exposes=exposes_on_leaving(view, placement.peer_id()), downloads=not placement.loads_from_disk())


def move_confirm_s(placement: Placement, view: SwarmView, periodic: bool) -> float:
    """How long a move decided on `view` waits for its confirmation: MOVE_CONFIRM_S, but a reaction that goes first
    among the peers that may decide with it on its layers (must_confirm) goes at once."""
    if periodic or must_confirm(view, placement.peer_id(), _my_react_delay(placement, view)):
        return MOVE_CONFIRM_S
    logger.info("no peer that may decide with us on layers %s goes before us: moving without a confirmation",
                placement.layers())
    return 0.0


def must_confirm(view: SwarmView, me: str, my_delay: float) -> bool:
    """Must this peer's reaction (decided after waiting `my_delay`, react_delay) confirm its move (MOVE_CONFIRM_S)?

    The confirmation is there for two peers that decide at the same moment to leave one range: each sees the
    other's announcement and steps back. Peers decide a reaction one react step after another, and a peer
    whose step is MOVE_CONFIRM_S or more from ours sees our announcement, or we its, as a confirmation would.
    So only the peers serving one of our layers that may decide within MOVE_CONFIRM_S of us matter, read from
    the view as they would read it (whether one exposes a layer or downloads its moves is not in its record:
    every reading counts). Of those, the one with the lowest id goes at once and the others confirm. One of
    the two still sees the other, whatever the crash notice's skew between them: the later decides on a view
    that holds the earlier's announcement, or the earlier's confirmation a second on holds the later's, unless
    their two DHT stores take over MOVE_CONFIRM_S together (two confirmations tolerate twice that). A gap's
    first refiller loads a second sooner (docs/balancing.md, forty-third session).
    """
    record = view.records.get(me)
    if record is None:
        return True
    for other in view.online():
        if (other.peer_id >= me or other.standby or other.moving_to is not None
                or not (other.layers.start < record.layers.end and record.layers.start < other.layers.end)):
            continue
        size = len(other.layers)
        if any(abs(react_delay(view, size, exposes, downloads) - my_delay) < MOVE_CONFIRM_S
               for exposes in (False, True) for downloads in (False, True)):
            return True
    return False


def react_delay(view: SwarmView, my_layers: int, exposes: bool = False, downloads: bool = False) -> float:
    """Seconds a peer holding `my_layers` layers waits before deciding on urgent layers.

    While some layer has no ONLINE or DRAINING server but standbys (SwarmView.uncovered_layers),
    every second stops clients or holds them to a standby's pace: the fastest loaders (the fewest
    layers, a move reloads them all) decide first, several in parallel, at once (REACT_FIRST_STEPS);
    the others a step per layer more than the view's smallest peers hold. Otherwise (layers thin, or
    served only by a draining peer) a slower refill costs some throughput, not service: the
    largest peers decide first, since one of them refills a departed large peer's range in one
    move where 4-layer peers need one move per 4 layers, each a reload (docs/balancing.md,
    "Who refills first").

    `exposes` (routing.exposes_on_leaving): leaving would leave one of this peer's layers to a
    single server no standby guards. Such a peer waits one step more, so that peers of its size
    whose leaving exposes nothing go first; if one of them took the urgent layers, it stays.
    A move opens that exposure for as long as a standby takes to get there, and a crash of the
    remaining server inside it is a gap (docs/balancing.md, tenth session).

    `downloads`: this peer's move would download its layers (a Hub model whose prefetch is not done,
    peer/prefetch.py), at the network's pace: an int8 70B layer's 0.86 GB take about 7 s over a 1 Gbit/s
    link, against 0.58 s measured from disk (benchmarks/bench_layer_load.py --quant int8, docs/performance.md;
    the simulator charges 5 s against 0.6). Such a peer waits until every peer loading from disk has decided,
    whatever their sizes, and refills only what none of them took (docs/balancing.md, forty-first session).
    """
    extra = REACT_DELAY_PER_LAYER_S if exposes else 0.0
    sizes = [len(r.layers) for r in view.online() if not r.standby]
    smallest, largest = min(sizes, default=my_layers), max(sizes, default=my_layers)
    if downloads:
        extra += REACT_DELAY_PER_LAYER_S * (max(largest - smallest, 0) + 2)
    if view.uncovered_layers(standbys=False):
        return REACT_DELAY_PER_LAYER_S * (max(my_layers - smallest, 0) + REACT_FIRST_STEPS) + extra
    return REACT_DELAY_PER_LAYER_S * (max(largest - my_layers, 0) + REACT_FIRST_STEPS) + extra


async def standby_loop(placement: Placement) -> None:
    """A standby re-reads the view every watch period (sooner on a crash notice) and moves to where more layers are one crash
    from dark (routing.standby_layers): sole servers change with every departure and move.

    Never while it serves sessions: clients use a standby only where nothing else serves, so a
    standby with sessions is the last live server of some layer, whatever the view says (a crashed
    peer's record stays listed for seconds, up to its TTL, and would let the standby leave).
    """
    while True:
        await _sleep_or_wake(placement, _watch_wait(placement))
        mine = placement.layers()
        try:
            view = await placement.fetch_view()
            if mine is None or placement.peer_id() not in view.records:
                continue
            target = standby_layers(view, placement.peer_id(), len(mine), machines(view, placement))
            if target is None:
                continue
            if (sessions := placement.open_sessions()) > 0:
                logger.info("standby: layers %s are more exposed than %s, but %d sessions use ours: no other "
                            "server of them answers, so staying", target, mine, sessions)
                continue
            logger.info("standby: layers %s are more exposed than %s (one crash from dark): moving there",
                        target, mine)
            # The most exposed layers first, each served as it arrives (routing.standby_load_order).
            await placement.migrate(target, standby_load_order(view, placement.peer_id(), target,
                                                               machines(view, placement)), view, MOVE_CONFIRM_S)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("standby round failed; staying on layers %s", mine)


def machines(view: SwarmView, placement: Placement) -> dict[str, str]:
    """Peer id -> machine (swarm.reachability.machine_of) for every record announcing a real IP, ours
    included: peers on one machine fail together, so a standby does not guard their layers."""
    out = {r.peer_id: m for r in view.records.values() if (m := machine_of(r.addrs)) is not None}
    if (mine := machine_of(placement.visible_maddrs())) is not None:
        out[placement.peer_id()] = mine
    return out
