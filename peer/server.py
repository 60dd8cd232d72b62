"""`PeerServer`: the life of one peer process, from loading weights to a clean goodbye.

start: join the DHT -> choose layers -> build the serving engine (weights, KV cache, decode graphs;
see `peer/engine.py`) and measure its throughput -> register the stream handler -> announce
ONLINE (and keep re-announcing before the record expires).
migrate (peer/moves.py, a mixin): serve another range, each layer as it arrives (beside or in place).
drain (SIGTERM): announce DRAINING -> keep serving until the swarm covers our layers without us
(see `peer/drain.py`) -> stop.
stop: announce OFFLINE -> refuse new work -> tell open sessions -> free everything -> leave.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version

import torch

from peer.balancer import Placement, balance_loop, choose_initial_layers, standby_loop
from peer.config import DTYPES, PeerConfig
from peer.crash_notices import CrashNotices
from peer.crash_watch import CrashWatch
from peer.drain import wait_until_covered
from peer.engine import ServingEngine
from peer.handler import ServedModel, StreamHandler
from peer.memory import available_bytes
from peer.moves import GROW_STEP_TIMEOUT_S, Moves
from peer.prefetch import prefetch_in_background
from peer.push import PushLinks
from peer.rate_limit import RateLimiter
from peer.scheduler import BatchScheduler
from peer.sessions import SessionRegistry
from peer.view import ViewService
from shards.batch import BatchLayout
from shards.config import ModelConfig
from shards.kv_cache import KVCache
from shards.paging import PagePool
from shards.quant import memory_plan
from shards.resolve import fetcher_for_peer
from swarm.auth import SwarmKey
from swarm.codec import Limits
from swarm.connection import answers, stream_handler
from swarm.dht import SwarmNode
from swarm.messages import PROTOCOL_NAME
from swarm.notices import tell
from swarm.schema import CrashNotice
from swarm.types import MAX_LOADING_ORDER, LayerRange, PeerRecord, PeerState, SwarmView

logger = logging.getLogger(__name__)



def software_version() -> str:
    try:
        return version("layerswarm")
    except PackageNotFoundError:
        return "dev"


# A suspect peer (peer/crash_watch.py) that has not answered an `info` request within this long
# is treated as gone: a live peer answers in milliseconds, a DHT round trip is well under it. A
# vanished host never answers, so this is part of every such crash's cost: 1 s, the client's
# shortest stall probe too (ClientConfig.stall_probe_min_s: a few round trips even over a relay;
# docs/balancing.md, eighteenth and thirty-fifth sessions). A client already found the suspect
# silent, so this only confirms it from a second place.
PROBE_TIMEOUT_S = 1.0


class PeerServer(Moves):
    def __init__(self, config: PeerConfig) -> None:
        self.config = config
        self.state = PeerState.JOINING
        self.layers = config.layers  # None until chosen (see peer/balancer.py)
        self.throughput = 0.0
        self.started = time.time()
        self.node: SwarmNode | None = None
        self.model_config = ModelConfig.from_pretrained(config.model_path)
        self.migrations = 0
        self.swarm_key = SwarmKey.load(config.swarm_key) if config.swarm_key else None
        self.moving = False  # while True, new sessions are refused (they go to other peers)
        self.loading: LayerRange | None = None  # a move's target while its weights load
        self.still_to_load: tuple[int, ...] = ()  # ... and its layers not yet arrived, in load order
        self.fetched: LayerRange | None = None  # the last range whose weight files _build_engine fetched
        self.in_place = False  # that move freed the old layers (announced JOINING, not moving_to)
        # Set when a move reads its layers from disk: a local checkpoint, or a Hub model once its
        # background prefetch is done (peer/prefetch.py). Unset, a move downloads them, and the balancer
        # lets the peers that load from disk refill first (peer/balancer.py react_delay).
        self.moves_load_from_disk = threading.Event()
        if config.model_repo is None:
            self.moves_load_from_disk.set()
        self.engine: ServingEngine | None = None  # None only while moving in place
        self.limits = Limits(config.limits.max_frame_bytes, config.limits.max_tensor_elements)
        # A crash notice wakes the balancer's watch (Placement.wake) and is passed on (peer/crash_notices.py).
        self.wake = asyncio.Event()
        self.crash_notices = CrashNotices(self._tell, lambda: self.peer_id, self.wake)
        self.crash_watch = CrashWatch(lambda: self.node.fetch_suspects_async(config.model_name), self._probe,
                                      lambda: self.peer_id, self.crash_notices.suspects, self.crash_notices.confirmed)
        # Announcements are stored one at a time, in the order their records were built (_store_record).
        self._store_lock = threading.Lock()
        self._records_built = 0
        self._record_stored = 0

    async def start(self) -> None:
        cfg = self.config
        loop = asyncio.get_running_loop()
        if cfg.cpu_threads > 0:
            torch.set_num_threads(cfg.cpu_threads)
        logger.info("joining the swarm (%d initial peers)", len(cfg.initial_peers))
        self.node = await loop.run_in_executor(
            None,
            lambda: SwarmNode(
                initial_peers=list(cfg.initial_peers),
                host_maddrs=list(cfg.host_maddrs),
                identity_path=str(cfg.identity_path) if cfg.identity_path else None,
                swarm_key=self.swarm_key,
                announce_maddrs=cfg.announce_maddrs, use_relay=cfg.use_relay, relayed=cfg.relayed,
            ),
        )
        self.p2p = await self.node.replicate_p2p()
        order = None  # a self-placing peer's load order: it then serves each layer as it arrives
        if self.layers is None:
            self.layers, order = await choose_initial_layers(self._placement())
        self.num_pages = self._pool_pages(self.layers)
        if order is not None:
            await self._join_growing(self.layers, order)
        else:
            self.engine, self.throughput = await self._build_engine(self.layers)
            await self._start_serving()
            self.state = PeerState.ONLINE
            await self._announce()
            self._start_announcing()
        if cfg.layers is None:  # a fixed --layers peer never moves
            placing = standby_loop if cfg.standby else balance_loop
            self._background.append(loop.create_task(placing(self._placement()), name="balance"))
            if cfg.prefetch and cfg.model_repo is not None:
                # A daemon thread, not the executor: a download cannot be cancelled, and stopping the
                # peer must not wait for one.
                threading.Thread(target=prefetch_in_background,
                                 args=(cfg.model_repo, cfg.revision, self.moves_load_from_disk),
                                 name="prefetch", daemon=True).start()

    async def _start_serving(self) -> None:
        """The page pool, sessions, scheduler and stream handler, around `self.engine` (None while a
        growing join loads its first layer: _serve_grown sets what depends on it then)."""
        cfg = self.config
        self.pool = PagePool(self.num_pages, cfg.page_size)
        self.registry = SessionRegistry(self.pool, cfg.limits, self._copy_page)
        if self.engine is not None:
            self.registry.use_engine(self.engine.fingerprint, self.engine.sliding_window)
        self.scheduler = BatchScheduler(
            self._run_batch, page_size=cfg.page_size, max_batch_tokens=cfg.max_chunk_tokens,
            batch_window=cfg.batch_window, enabled=cfg.batching, inline=self._replays,
        )
        self.scheduler.start()
        self.push_links = PushLinks(self.p2p, self.limits, cfg.step_timeout, self.swarm_key)
        self.handler = StreamHandler(
            ServedModel(self.layers, self.model_config.hidden_size, DTYPES[cfg.dtype]),
            self.registry, self.scheduler, self.push_links, self.limits, self.info,
            cfg.alloc_timeout, lambda: self.state is not PeerState.OFFLINE and not self.moving, cfg.faulty,
            self.swarm_key, self.peer_id, RateLimiter(cfg.limits.max_steps_per_second),
        )
        self.handler.forward_priority = cfg.forward_priority
        self.handler.page_outputs = self.engine.page_outputs if self.engine is not None else None
        self.handler.view = ViewService(self.node.fetch_signed_view_async, cfg.model_name).answer
        self.handler.crash_notice = self.crash_notices.receive
        await self.p2p.add_binary_stream_handler(PROTOCOL_NAME, stream_handler(self.handler.serve, self.limits))

    def _start_announcing(self) -> None:
        loop = asyncio.get_running_loop()
        self._background = [
            loop.create_task(self._announce_loop(), name="announce"),
            loop.create_task(self._reap_loop(), name="reap-idle"),
        ]

    async def _join_growing(self, target: LayerRange, order: Sequence[int]) -> None:
        """A self-placing peer's join: announced JOINING on `target`, it serves each layer as it
        arrives (as Moves._move_growing does), refusing sessions until the first one can run."""
        self.loading, self.in_place, self.moving = target, True, True
        self.still_to_load = tuple(order)
        await self._start_serving()
        await self._announce()
        self._start_announcing()
        logger.info("loading layers %s, serving each as it arrives (order %s)", target, ",".join(map(str, order)))
        loop = asyncio.get_running_loop()

        def grew(engine: ServingEngine, served: LayerRange, throughput: float) -> None:  # on the loading thread
            asyncio.run_coroutine_threadsafe(self._serve_grown(engine, served, throughput, target), loop).result(
                timeout=GROW_STEP_TIMEOUT_S)

        try:
            engine, throughput = await self._build_engine(target, order, grew)
        finally:
            self.loading, self.in_place = None, False
        if engine.graphs is not None:
            throughput = await self._graph_throughput(engine, throughput)
        await self._install(engine, throughput, target, moved=False)

    async def _graph_throughput(self, engine: ServingEngine, first: float) -> float:
        """A growing join's speed once its whole range's decode graphs are captured. The one measured
        on its first layer alone (`first`, on that layer's graphs) charges one layer with a whole step's
        fixed costs (copies, a sync), so it is too low over k layers, and unlike a move a join has no
        earlier range to take its speed from. Its sessions may hold pages 0..k by now, so the
        measurement takes its pages from the pool as a session does, and runs between batches."""
        pages = self.pool.allocate(engine.measure_pages())
        if pages is None:
            logger.warning("no free cache pages to measure the CUDA graphs' speed on; announcing the speed "
                           "measured on the first layer (%.1f tokens/s) until the next move", first)
            return first
        try:
            throughput = await self.scheduler.run_exclusive(lambda: engine.measure_throughput(pages=pages))
        finally:
            self.pool.free(pages)
        logger.info("throughput on CUDA graphs: %.1f tokens/s through %d layers (%.1f from its first layer)",
                    throughput, len(engine.served), first)
        return throughput

    def _placement(self) -> Placement:
        """What the balancer may read and do: the few callables it needs, not the server."""
        cfg = self.config
        return Placement(
            config=cfg,
            model_config=self.model_config,
            fetch_view=self._balancing_view,
            heard_view=self._heard_view,
            peer_id=lambda: self.peer_id,
            visible_maddrs=self.visible_maddrs,
            layers=lambda: self.layers,
            throughput=lambda: self.throughput,
            migrate=self.migrate,
            pre_read=self.pre_read,
            open_sessions=lambda: len(self.registry.sessions),  # read only once serving (the balance loops)
            wake=self.wake,
            loads_from_disk=self.moves_load_from_disk.is_set,
        )

    async def _balancing_view(self) -> SwarmView:
        """The view balancing and draining decide on: the DHT's, less the records of peers that
        clients reported unreachable and that do not answer us either (peer/crash_watch.py). The
        records and the reports are read at once: one DHT read's time, not two."""
        view, reported = await asyncio.gather(
            self.node.fetch_view_async(self.config.model_name, self.model_config.num_layers),
            self.crash_watch.read_reports())
        self.crash_notices.note_view(view)  # whom to tell of a crash, and which announcements are current
        return await self.crash_watch.screen(view, reported)

    async def _heard_view(self) -> SwarmView | None:
        """The last view read, less the suspects we were told of directly that do not answer our probe:
        no DHT read (Placement.heard_view). None before the first read."""
        if self.crash_notices.view is None:
            return None
        return await self.crash_watch.screen(self.crash_notices.view, reported={})

    async def _probe(self, peer_id: str) -> bool:
        return await answers(self.p2p, peer_id, self.limits, self.swarm_key, PROBE_TIMEOUT_S)

    async def _tell(self, recipients: list[str], notice: CrashNotice) -> int:
        return await tell(self.p2p, recipients, notice, self.limits, self.swarm_key)

    async def _build_engine(
        self, layers: LayerRange, order: Sequence[int] | None = None,
        on_grow: Callable[[ServingEngine, LayerRange, float], None] | None = None,
    ) -> tuple[ServingEngine, float]:
        """Load layers, allocate their cache, capture graphs and measure tokens/s: all off the event loop.

        Measured before the engine serves anyone, so the measurement's cache pages are its own. With
        `on_grow` (ServingEngine.load: each layer served as it arrives, in `order`) that is after the
        first layer: `on_grow(engine, served, tokens/s through served)` is called after each layer,
        at that one layer's speed over the served layers (a layer's cost does not depend on how many
        the peer holds).
        """
        cfg = self.config
        logger.info("loading layers %s of %s (%s, %s, quant %s)", layers, cfg.model_path, cfg.dtype, cfg.device,
                    cfg.quant)

        def build() -> tuple[ServingEngine, float]:
            fetch_layer = None
            if cfg.model_repo is not None:  # each layer's weight files as the load reaches it (cached ones stay)
                fetcher = fetcher_for_peer(cfg.model_repo, cfg.revision, (layers.start, layers.end))

                def fetch_layer(layer: int) -> None:
                    fetcher.fetch(layer)
                    if fetcher.done:  # the rest of the load reads the disk: its records no longer say downloading
                        self.fetched = layers
            layer_speed: list[float] = []  # one layer's tokens/s, measured on the first to arrive

            def grew(engine: ServingEngine, served: LayerRange) -> None:
                if not layer_speed:  # nobody uses this engine's cache yet
                    layer_speed.append(engine.measure_throughput() * len(served))
                on_grow(engine, served, layer_speed[0] / len(served))

            engine = ServingEngine.load(
                str(cfg.model_path), layers, dtype=DTYPES[cfg.dtype], device=cfg.device, quant=cfg.quant,
                quant_group_size=cfg.quant_group_size, num_pages=self.num_pages, page_size=cfg.page_size,
                max_length=cfg.limits.max_length, graphs=cfg.cuda_graphs, order=order,
                on_grow=grew if on_grow is not None else None, stream_weights=cfg.stream_weights,
                fetch_layer=fetch_layer,
            )
            if layer_speed:
                return engine, layer_speed[0] / len(layers)
            return engine, engine.measure_throughput()

        engine, throughput = await asyncio.get_running_loop().run_in_executor(None, build)
        path = "CUDA graphs" if engine.graphs is not None else "eager"
        logger.info("throughput: %.1f tokens/s through %d layers (%s%s)", throughput, len(layers), path,
                    ", weights streamed from host memory" if cfg.stream_weights else "")
        return engine, throughput

    def _pool_pages(self, layers: LayerRange) -> int:
        """KV pages: `--cache-tokens`, or `--cache-fraction` of the free device memory (after the weights).

        A page costs its KV over the served layers plus its stored output rows (`PageOutputs`,
        host memory: counted only when the cache is in host memory too).
        """
        cfg = self.config
        if cfg.cache_fraction <= 0:
            return cfg.num_pages
        dtype = DTYPES[cfg.dtype]
        per_token = KVCache.bytes_per_token(self.model_config, len(layers), dtype)
        if not cfg.device.startswith("cuda"):
            per_token += self.model_config.hidden_size * torch.empty((), dtype=dtype).element_size()
        free = available_bytes(cfg.device)
        if cfg.device.startswith("cuda"):  # the weights are not loaded yet: leave room for them
            # (streamed weights take two layers' slots on the device, the rest stays in host memory)
            on_device = 2 if cfg.stream_weights else len(layers)
            free -= memory_plan(self.model_config, on_device, cfg.quant, dtype, 0,
                                cfg.quant_group_size)["weight_bytes"]
        pages = int(free * cfg.cache_fraction) // (per_token * cfg.page_size)
        logger.info("KV pool: %d pages of %d tokens (%.2f of free %s memory)", pages, cfg.page_size,
                    cfg.cache_fraction, cfg.device)
        return max(1, pages)

    async def _copy_page(self, src: int, dst: int) -> None:
        """Copy-on-write of a shared page, on the compute thread between two batches."""
        await self.scheduler.run_exclusive(lambda: self.engine.copy_page(src, dst))

    @property
    def peer_id(self) -> str:
        assert self.node is not None
        return self.node.peer_id

    def visible_maddrs(self) -> list[str]:
        assert self.node is not None
        return self.node.visible_maddrs()

    def record(self) -> PeerRecord:
        cfg = self.config
        # Moving (migrate): the old layers stay ONLINE, the target is `moving_to`, until the first new
        # one can run (beside) or the old ones are freed (in place: from then on the target is JOINING
        # until its first layer runs); then the loaded part is `layers`.
        layers, state, moving_to = self.layers, self.state, None
        if self.loading is not None and state is PeerState.ONLINE:
            if self.in_place:
                layers, state = self.loading, PeerState.JOINING
            else:
                moving_to = self.loading
        # Announced while loading, so the next loader of a dark stretch starts where this one arrives
        # last (routing.move_load_order).
        loading_order = self.still_to_load[:MAX_LOADING_ORDER] if self.loading is not None else ()
        # A load that fetches its files over the network (a Hub model whose prefetch is not done, until its
        # last layer's files are in: each layer's come as the load reaches it) says so: on dark layers a
        # reaction counts it only where it serves, and disk loaders refill the rest (routing.downloads).
        downloading = (bool(loading_order) and cfg.model_repo is not None and not self.moves_load_from_disk.is_set()
                       and self.fetched != self.loading)
        return PeerRecord(
            peer_id=self.peer_id, model=cfg.model_name, layers=layers, state=state, moving_to=moving_to,
            loading_order=loading_order or None, downloading=downloading,
            throughput=self.throughput, free_pages=self.pool.num_free, total_pages=self.pool.num_pages,
            page_size=cfg.page_size, dtype=cfg.dtype, quant=cfg.quant, version=software_version(),
            public_name=cfg.public_name, fingerprint=self.registry.fingerprint,
            addrs=tuple(self.visible_maddrs()), num_layers=self.model_config.num_layers, updated=time.time(),
            relayed=cfg.relayed, standby=cfg.standby,
        )

    def info(self) -> dict:
        return {
            "record": self.record().to_dict(),
            "stats": {
                "sessions": len(self.registry.sessions),
                "queued_steps": self.scheduler.queued,
                **self.scheduler.stats(),  # batches_run, tokens_run, sequences_run, busy_seconds, ...
                **self.registry.stats(),  # free / evictable / used pages, prefix hits
                "pushes": self.push_links.pushes,
                "crash_notices_dropped": self.crash_notices.dropped,  # over the rate limit (a flood?)
                "uptime": round(time.time() - self.started, 1),
                "migrations": self.migrations,
                "graph_batches": self.engine.steps["graph"] if self.engine is not None else 0,
                "eager_batches": self.engine.steps["eager"] if self.engine is not None else 0,
                # A growing range's decode batches, replayed as a chain of per-layer graphs.
                "chain_batches": self.engine.steps["chain"] if self.engine is not None else 0,
                "errors": dict(self.handler.errors),
                "refusals": dict(self.registry.counters),
            },
        }

    def _replays(self, hidden: torch.Tensor, layout: BatchLayout, layers: tuple[int, int], stateful: bool) -> bool:
        return self.engine is not None and self.engine.replays(hidden, layout, layers, stateful)

    def _run_batch(self, hidden: torch.Tensor, layout: BatchLayout, layers: tuple[int, int],
                   stateful: bool) -> torch.Tensor:
        if self.engine is None:  # moving in place: the sessions were failed over, this step came late
            raise RuntimeError("no layers are loaded while this peer moves; fail over")
        return self.engine.run_batch(hidden, layout, layers, stateful)  # whichever engine is current

    async def _announce(self) -> None:
        record = self.record()
        self._records_built += 1
        ok = await asyncio.get_running_loop().run_in_executor(None, self._store_record, record, self._records_built)
        if not ok:
            logger.warning("announcing %s to the DHT failed; will retry", record.state.value)

    def _store_record(self, record: PeerRecord, number: int) -> bool:
        """(On an executor thread.) Store the `number`-th record built, unless a later one is stored already.

        hivemind keeps the record with the latest expiration, and the expiration is taken when the
        store starts. Two announcements in flight at once (the refresh loop, a growing move's next
        range, a stop's OFFLINE: a cancelled await does not stop its executor thread) could store an
        older state last, and it would stand until the next refresh. One at a time, newest wins.
        """
        with self._store_lock:
            if number < self._record_stored:
                return True  # superseded: a newer state is in the DHT already
            self._record_stored = number
            return self.node.announce(record, self.config.announce_ttl)

    async def _announce_loop(self) -> None:
        # Re-announce at a third of the TTL: two lost announcements in a row still leave us visible.
        while True:
            await asyncio.sleep(self.config.announce_ttl / 3)
            try:
                await self._announce()
            except Exception:
                logger.exception("announce failed")

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(min(5.0, self.config.limits.idle_timeout / 2))
            for session_id in await self.registry.close_idle():
                logger.info("closed idle session %s", session_id)
                self.push_links.close(session_id)

    async def drain(self, timeout: float) -> str:
        """Announce DRAINING and serve on until our layers are covered without us (at most `timeout` s).

        Returns why the wait ended: "covered", "no_taker" or "timeout" (see peer/drain.py).
        """
        if self.node is None or not hasattr(self, "engine"):
            return "not_started"
        for task in getattr(self, "_background", []):
            if task.get_name() == "balance":
                task.cancel()  # a leaving peer does not move
        self.state = PeerState.DRAINING
        await self._announce()
        logger.info("draining: serving layers %s until other peers cover them (at most %.0f s)", self.layers, timeout)
        placement = self._placement()
        reason = await wait_until_covered(placement.fetch_view, self.peer_id, timeout)
        logger.info("draining done (%s)", {"covered": "other peers now serve our layers",
                                           "no_taker": "no peer can take our layers over",
                                           "timeout": "the drain timeout ran out"}[reason])
        return reason

    async def stop(self) -> None:
        """Leave politely: OFFLINE first, so clients stop routing here before sessions end."""
        logger.info("stopping: announcing OFFLINE")
        self.state = PeerState.OFFLINE
        for task in getattr(self, "_background", []):
            task.cancel()
        if self.node is not None:
            try:
                await asyncio.wait_for(self._announce(), timeout=5)
            except Exception:
                logger.warning("could not announce OFFLINE; the record will expire by itself")
        if hasattr(self, "handler"):
            await self.handler.fail_all("shutting_down", "this peer is shutting down; fail over to another peer")
            self.push_links.close_all()
        if hasattr(self, "scheduler"):
            await self.scheduler.stop()
        if self.node is not None:
            try:
                await self.p2p.shutdown()
            except Exception:
                pass
            self.node.shutdown()
        logger.info("stopped")

