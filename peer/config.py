"""`PeerConfig`: everything a peer process is told at start; building one does no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from swarm.codec import Limits
from swarm.types import LayerRange

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Torch CPU threads of a GPU peer unless --num-threads says otherwise. Its CPU work is small (step
# layouts, staging copies), and torch's default of one thread per core oversubscribes a machine that
# runs two such processes (a standby beside its host's peer, one peer per GPU): on an H200 host of 16
# cores a peer decoding beside a streaming standby kept 24-33% of its speed at torch's default in both
# and 70-96% at 1 or 4 threads each, and alone it ran as fast at 1 thread as at 16 (docs/performance.md).
GPU_PEER_THREADS = 4
# Between balance checks a self-placing peer (or standby) re-reads the view this often (+-25%,
# peer/balancer.py): a layer left without an ONLINE server (its only server is draining, or
# vanished), or left thin (routing.thin_layers: a departure halved it), is seen within seconds and
# decided on at once, not at the next period. A draining peer waits for exactly this (peer/drain.py).
# A crash notice (peer/crash_notices.py) wakes the watch sooner. --watch-period sets it per peer.
WATCH_PERIOD_S = 5.0


@dataclass(frozen=True)
class ServingLimits:
    """Per-peer protection against greedy or hostile clients; each is a `swarm-peer serve` option."""

    max_frame_bytes: int = Limits().max_frame_bytes  # the largest tensor allowed plus the message's other fields
    max_tensor_elements: int = 64 * 2**20
    max_sessions: int = 256
    max_sessions_per_remote: int = 64
    max_length: int = 8192  # tokens per sequence of a session
    max_batch: int = 64  # sequences per session
    max_steps_per_second: float = 2000.0  # per client, bursts of twice that: far above honest use, stops floods
    idle_timeout: float = 300.0  # seconds without a step before a session is closed and its pages freed
    # KV pages one client may hold at once (its sessions and stateless forwards together), as a share of
    # the pool: one client's prefill can never take the whole cache and leave the others `busy`.
    max_client_pages_fraction: float = 0.5
    # Prefix pages are shared only among one client's own sessions: another client's pages are only as
    # trustworthy as that client's inputs (a junk prefill with someone else's token ids would poison
    # them). A private swarm of trusted members may share across clients (--share-prefix-across-clients).
    share_prefix_across_clients: bool = False


@dataclass(frozen=True)
class FaultyOutputs:
    """TEST ONLY (hidden `--faulty`): add noise of this std to a result, on this fraction of results."""

    std: float
    probability: float = 1.0


@dataclass(frozen=True)
class PeerConfig:
    model_path: Path
    layers: LayerRange | None  # None: the peer chooses (num_layers, or as many as fit) and may move
    model_name: str
    num_layers: int | None = None
    # A Hub repo id when --model named one: the files of each range are fetched when the range is
    # chosen (at start and on every move), so a self-placing peer downloads only its layers.
    model_repo: str | None = None
    revision: str | None = None
    # A self-placing peer of a Hub model fetches every layer's files in the background once it serves
    # (shards.resolve.prefetch_layers, when the disk has room), so its moves load from disk.
    prefetch: bool = True
    initial_peers: tuple[str, ...] = ()
    host_maddrs: tuple[str, ...] = ("/ip4/127.0.0.1/tcp/0",)
    announce_maddrs: tuple[str, ...] | None = None  # what others dial (None: the daemon's own guess)
    use_relay: bool = True  # libp2p circuit relays: reach relayed peers, and be relayed when unreachable
    relayed: bool = False  # failed the dial-back check: DHT client only, reachable through a relay
    identity_path: Path | None = None
    swarm_key: Path | None = None  # private swarm: members share this secret file
    device: str = "cpu"
    dtype: str = "float32"
    quant: str = "none"  # weight-only quantization applied while loading: none, int8 or int4
    quant_group_size: int = 128  # int4 group size (64 or 128)
    cache_tokens: int = 8192
    cache_fraction: float = 0.0  # > 0: size the KV pool to this share of free device memory instead
    page_size: int = 16
    public_name: str = ""
    announce_ttl: float = 30.0  # a killed peer's record vanishes at most this long after its death
    batch_window: float = 0.002  # seconds to wait for more steps when the compute is busy
    max_chunk_tokens: int = 512  # prefill chunk, so a long prompt never stalls other sessions' decodes
    batching: bool = True  # False (--no-batching): one step per forward pass, the benchmark baseline
    forward_priority: int = 1  # scheduling priority of stateless forwards; steps have 0, lower first
    alloc_timeout: float = 5.0  # a step that finds the page pool full waits this long, then gets "busy"
    step_timeout: float = 30.0  # downstream push timeout
    num_threads: int = 0  # torch intra-op threads; 0: GPU_PEER_THREADS on CUDA, torch's default on a CPU (cpu_threads)
    cuda_graphs: bool = True  # decode-only batches on CUDA replay captured graphs (--no-cuda-graphs: eager)
    balance_period: float = 120.0  # seconds between re-reads of the swarm (randomised +-25%)
    watch_period: float = WATCH_PERIOD_S  # ... and between its reads for gaps in between (peer/balancer.py)
    balance_quality: float = 0.75  # move only if the bottleneck grows by more than 1/quality
    # How a move loads its new range: "beside" the old one (serving on; needs memory for both),
    # "in-place" (free the old range first), or "auto" (beside when free memory holds it).
    move_mode: str = "auto"
    # A periodic check's move first reads its target's weights into the page cache, serving on and
    # announcing nothing, then decides again (peer/balancer.py pre_read_unless_woken; --pre-read). Off by
    # default: fewer moves, each a fifth as long out, but 1.2 points less flow at 2,000 simulated peers
    # (docs/balancing.md, thirty-seventh session).
    pre_read: bool = False
    # A slow safety net (swarm-peer serve --standby): self-places on the layers one crash would
    # leave dark (routing.standby_layers); others' balancing ignores it, clients use it last.
    standby: bool = False
    # Keep the weights in host memory and copy them to the device a layer at a time at every step
    # (--stream-weights, shards.streaming): a standby on its host's GPU, beside the host's own peer.
    stream_weights: bool = False
    faulty: FaultyOutputs | None = None  # TEST ONLY: a lying peer, to exercise client verification
    limits: ServingLimits = field(default_factory=ServingLimits)

    @property
    def cpu_threads(self) -> int:
        """The torch intra-op threads the peer sets; 0: leave torch's default (one per core), which a
        CPU peer computes with."""
        if self.num_threads > 0:
            return self.num_threads
        return GPU_PEER_THREADS if self.device.startswith("cuda") else 0

    @property
    def weights_device(self) -> str:
        """Where the layers' weights live: the device, or host memory when they are streamed."""
        return "cpu" if self.stream_weights else self.device

    @property
    def num_pages(self) -> int:
        return max(1, self.cache_tokens // self.page_size)
