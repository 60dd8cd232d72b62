"""How a running peer changes its layers: `Moves.migrate`, each new layer served as it arrives (beside or in place).

A mixin of `PeerServer` (peer/server.py), kept apart so each file has one purpose: the server
starts, serves and stops; this file swaps what it serves. The attributes it reads and sets are
the server's, declared below for the reader and the type checker.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence

import torch

from peer.balancer import MOVE_CONFIRM_S
from peer.config import DTYPES, PeerConfig
from peer.engine import ServingEngine
from peer.handler import StreamHandler
from peer.memory import HEADROOM, available_bytes
from peer.scheduler import BatchScheduler
from peer.sessions import SessionRegistry
from routing import gaps_opened_since, may_move
from shards.config import ModelConfig
from shards.pre_read import PreRead, pre_read_layers
from shards.quant import memory_plan
from swarm.types import LayerRange, PeerState, SwarmView

logger = logging.getLogger(__name__)


# A pre-read (shards.pre_read) stops after this long, and a move there reads the rest from disk: the
# balance check that asked for it decides again once it is over, on a view as old as the read.
# Two minutes read 24 layers of a 70B model at 0.3 GB/s, a slow SATA disk's speed.
PRE_READ_MAX_S = 120.0
# A moving peer serving each layer as it arrives waits at most this long for the event loop to take
# each new layer (a fail-over of the old range's sessions and one announcement take well under it).
GROW_STEP_TIMEOUT_S = 60.0


class MoveHalted(Exception):
    """Raised on a growing move's loading thread once the move was cancelled."""


class Moves:
    """PeerServer's moves; see the module docstring."""

    config: PeerConfig
    model_config: ModelConfig
    state: PeerState
    layers: LayerRange | None
    throughput: float
    engine: ServingEngine | None
    loading: LayerRange | None
    still_to_load: tuple[int, ...]
    in_place: bool
    moving: bool
    migrations: int
    num_pages: int
    handler: StreamHandler
    scheduler: BatchScheduler
    registry: SessionRegistry
    peer_id: str
    _announce: Callable[[], Awaitable[None]]
    _balancing_view: Callable[[], Awaitable[SwarmView]]
    _build_engine: Callable[..., Awaitable[tuple[ServingEngine, float]]]

    async def migrate(self, target: LayerRange, order: Sequence[int] | None = None,
                      decided_on: SwarmView | None = None, confirm_s: float = MOVE_CONFIRM_S) -> bool:
        """Serve `target` instead of the current range, without dropping a request silently.

        The move is announced first, and checked once more `confirm_s` later: routing.plan_move
        moves only a peer whose every layer has another server, but two peers on one range may
        decide to leave it at the same moment; each then sees the other's announcement and stays
        (returns False; the balancer retries at a jittered time, so one of them goes first).
        With `confirm_s` 0 the move goes at once (peer/balancer.py must_confirm: a reaction that no
        peer serving these layers can make at the same moment without confirming its own).
        With `decided_on` (the view the move was decided on) it also steps back when a layer
        outside `target` lost its last server since (routing.gaps_opened_since: a crash the
        crash watch saw meanwhile): gaps come first, and the next read decides for them.

        Then the target's layers load in `order` (default: layer order; the balancer passes
        routing.move_load_order, a standby routing.standby_load_order) and each is served as it
        arrives (_move_growing): beside the old range when memory holds both (or --move-mode
        beside), which serves until the first new layer can run; in place otherwise (a GPU filled
        by its own range, or --move-mode in-place), announced JOINING on the target as the old
        engine is freed first. Open sessions on the old range fail over (a clear retryable error
        frame each). Neither way leaves a gap. A failed load serves the old range again.
        """
        beside = self._room_beside(target)
        # Until it frees the old range (in place) or serves a new layer (beside), its record says it
        # serves the old range and is moving to `target`: balancing counts it there, routes use the old
        # range's peer last (its sessions fail over at the swap), and the sessions it has go on.
        self.loading, self.in_place = target, False
        arrivals = tuple(range(target.start, target.end) if order is None else order)
        # Its load order is a promise of when each layer arrives (the next loader of a dark stretch
        # starts where this one arrives last, routing.move_load_order): a move still confirming may
        # step back, and its first layer comes a confirmation later than its order says, so it
        # announces the order only as its load starts (docs/balancing.md, forty-fifth session).
        self.still_to_load = () if confirm_s > 0 else arrivals
        try:
            await self._announce()
            why = None
            if confirm_s > 0:
                await asyncio.sleep(confirm_s)
                why = self._step_back_reason(await self._balancing_view(), target, decided_on)
            if why is not None:
                logger.info("%s: staying on layers %s for now", why, self.layers)
                self.loading, self.in_place = None, False
                await self._announce()
                return False
            if confirm_s > 0:
                self.still_to_load = arrivals
                await self._announce()
        except Exception:
            self.loading, self.in_place = None, False
            await self._announce()  # ONLINE on the old range again at once, not at the next refresh
            raise
        await self._move_growing(target, arrivals, beside)
        return True

    async def pre_read(self, target: LayerRange, halted: threading.Event) -> PreRead:
        """Read `target`'s weight bytes into the page cache off the event loop (shards.pre_read), serving
        on meanwhile: a move there then loads from memory. Stops at its next chunk once `halted` is set."""
        read_ahead = functools.partial(pre_read_layers, self.config.model_path, target.start, target.end,
                                       available_bytes=available_bytes("cpu"), max_s=PRE_READ_MAX_S,
                                       halted=halted.is_set)
        read = await asyncio.get_running_loop().run_in_executor(None, read_ahead)
        if read.bytes_read:
            logger.info("read %.1f MiB of layers %s into memory in %.1f s%s", read.bytes_read / 2**20, target,
                        read.seconds, "" if read.skipped is None else f" ({read.skipped})")
        else:
            logger.info("read nothing of layers %s ahead: %s", target, read.skipped)
        return read

    def _step_back_reason(self, view: SwarmView, target: LayerRange, decided_on: SwarmView | None) -> str | None:
        """Why an announced move to `target` must not go on, read on the confirmation's `view`; None: go."""
        if not may_move(view, self.peer_id, self.layers, target):
            return f"another peer is leaving layers of {self.layers} at the same time"
        opened = [] if decided_on is None else gaps_opened_since(decided_on, view, self.peer_id, target)
        if opened:
            return (f"layers {opened[0]}-{opened[-1]} lost their last server since this move was decided "
                    "(the next read of the swarm decides for them)")
        return None

    async def _move_growing(self, target: LayerRange, order: Sequence[int], beside: bool) -> None:
        """Move to `target` serving each layer as it arrives, in `order` (each prefix one range).

        A standby moves to layers one crash from dark: a layer it serves after one layer's load guards
        it a whole window's load sooner (docs/balancing.md: the exposed layers halve in the simulator).
        A GPU peer moves to gaps or thin layers: each serves a whole load sooner (docs/balancing.md,
        eleventh session), on its own decode graphs captured as it arrives (ServingEngine.load's
        chain), and the whole range's graphs are captured once all are there.
        Beside (memory holds both), the old range serves on until the first new layer can run; in
        place, it is freed first. From the first layer on, the record announces the loaded range
        ONLINE with `moving_to` the target: clients route to the layers served, balancing counts
        it at the target. Sessions open on a partial range keep their layers as it grows. A failed
        load after the first layer loads the old range again, as an in-place move does.
        """
        old, old_engine, old_throughput, loop = self.layers, self.engine, self.throughput, asyncio.get_running_loop()
        arrival = ",".join(map(str, order))
        if beside:
            logger.info("moving from layers %s to %s (announced as moving there while loading, serving each layer "
                        "as it arrives: order %s)", old, target, arrival)
        else:
            logger.info("moving from layers %s to %s in place (%s): announcing JOINING there, freeing the old "
                        "layers first, serving each layer as it arrives: order %s", old, target, self._why_in_place(), arrival)
        if not beside:
            self.moving, self.in_place = True, True
            await self._announce()  # JOINING on the target: the old range is no longer served
            await self.handler.fail_all("wrong_layers", f"peer is moving from layers {old} to {target}; fail over")
            await self.scheduler.run_exclusive(self._release_engine)

        halted = threading.Event()  # set once this move is over: a load still running stops at its next layer

        def grew(engine: ServingEngine, served: LayerRange, throughput: float) -> None:  # on the loading thread
            if engine.chain is not None and old_throughput > 0:
                # On its per-layer graphs a growing range runs at 0.95-0.99 of a whole range's graph
                # speed (docs/performance.md, run N): the old range's graph-measured speed per layer
                # says it better than `throughput`, measured on the first layer alone, which bears a
                # whole step's fixed costs (copies, a sync) and so undersells k layers.
                throughput = old_throughput * len(old) / len(served)
            if halted.is_set():  # the move was cancelled (a drain stops the balancer): grow no further
                raise MoveHalted(f"the move to {target} was cancelled at layers {served}")
            # Bounded: a peer stopped mid-move must not leave this thread waiting on a closed loop.
            asyncio.run_coroutine_threadsafe(self._serve_grown(engine, served, throughput, target), loop).result(
                timeout=GROW_STEP_TIMEOUT_S)

        try:
            try:
                engine, throughput = await self._build_engine(target, order, grew)
            except Exception:
                if beside and self.engine is old_engine:  # nothing given up yet: serve the old range on
                    raise
                logger.exception("loading layers %s failed; loading layers %s again", target, old)
                engine, throughput = await self._build_engine(old)
                target = old
        except Exception:
            if self.engine is None:
                self.state = PeerState.OFFLINE  # nothing is loaded: nobody may route here
            self.loading, self.in_place, self.moving = None, False, False
            await self._announce()
            raise
        finally:
            # Cancelled too (CancelledError passes the except above): the peer then serves what has
            # arrived, as an ONLINE record of that range, and the loading thread stops growing it.
            halted.set()
            self.loading, self.in_place = None, False
        if engine.graphs is not None and target != old:
            # Measured on the first layer alone, which bears a whole step's fixed costs: too low over k
            # layers. The old range's speed was measured on its whole graphs, on the same device, and a
            # layer's cost does not depend on where it is.
            throughput = old_throughput * len(old) / len(target)
        await self._install(engine, throughput, target)

    async def _serve_grown(self, engine: ServingEngine, served: LayerRange, throughput: float,
                           target: LayerRange) -> None:
        """(On the loop.) `engine` can run `served` now: the first time, it replaces the old engine."""
        if self.engine is not engine:
            await self._swap_engine(engine, f"peer moved from layers {self.layers} to {target}; fail over")
            self.in_place, self.moving = False, False  # the served part is ONLINE, the target `moving_to`
            self.state = PeerState.ONLINE  # a growing join's first layer (a move's state is ONLINE already)
        self.layers, self.throughput = served, throughput
        self.still_to_load = tuple(layer for layer in self.still_to_load if layer not in served)
        self.registry.fingerprint = engine.fingerprint  # of `served`: prefix hashes are relative to it
        self.handler.served.layers = served
        if served != target:  # the whole target is announced by _install, once the load returns
            await self._announce()
            logger.info("serving layers %s of %s at %.1f tokens/s (the rest still loading)", served, target, throughput)

    async def _swap_engine(self, engine: ServingEngine, reason: str) -> None:
        """Make `engine` the one batches run on. Its KV cache is new: the sessions on the old one
        fail over (`reason`), and the cached prefix pages are forgotten, since their content lived in
        the old cache (a peer back on a range it served before would attach them otherwise).
        New sessions are refused meanwhile (`moving`; the caller clears it)."""
        self.moving = True
        await self.handler.fail_all("wrong_layers", reason)

        def swap() -> None:  # on the compute thread: no batch is running on the old engine
            self.engine = engine

        await self.scheduler.run_exclusive(swap)
        self.registry.use_engine(engine.fingerprint, engine.sliding_window)
        self.handler.page_outputs = engine.page_outputs

    def _why_in_place(self) -> str:
        return "--move-mode in-place" if self.config.move_mode == "in-place" else "no memory for both"

    def _room_beside(self, target: LayerRange) -> bool:
        """Does the device hold `target`'s engine next to the current one?"""
        cfg = self.config
        if cfg.move_mode != "auto":
            return cfg.move_mode == "beside"
        plan = memory_plan(self.model_config, len(target), cfg.quant, DTYPES[cfg.dtype], self.num_pages * cfg.page_size,
                           cfg.quant_group_size)
        if cfg.stream_weights:  # the weights go to host memory; the cache and two layers' slots to the device
            on_device = int(plan["kv_cache_bytes"]) + 2 * int(plan["weight_bytes_per_layer"])
            return (int(plan["weight_bytes"]) <= available_bytes("cpu") * HEADROOM
                    and on_device <= available_bytes(cfg.device) * HEADROOM)
        return int(plan["total_bytes"]) <= available_bytes(cfg.device) * HEADROOM

    def _release_engine(self) -> None:
        """(On the compute thread, between batches.) Drop the engine so its memory can be reused."""
        self.engine, self.handler.page_outputs = None, None
        gc.collect()
        if self.config.device.startswith("cuda"):
            torch.cuda.empty_cache()

    async def _install(self, engine: ServingEngine, throughput: float, target: LayerRange, *,
                       moved: bool = True) -> None:
        """Make `engine` (serving `target`) the current one and announce it ONLINE there (`moved`:
        False for a growing join, which is no migration). A growing load's engine is current already;
        another (a failed load's old range, loaded again) replaces it as _serve_grown's first step does."""
        if engine is not self.engine:
            await self._swap_engine(engine, f"peer serves layers {target} again; fail over")
        self.layers, self.throughput = target, throughput
        self.registry.fingerprint = engine.fingerprint  # of the whole range now
        self.handler.served.layers = target
        self.moving = False
        self.migrations += moved
        if engine.device.type == "cuda":
            torch.cuda.empty_cache()  # hand the old engine's memory back before the next move
        await self._announce()
        # Tests and operators read "now serving" as a move's end; a growing join says it joined.
        logger.info("now serving layers %s" if moved else "joined: serving layers %s, all loaded", target)
