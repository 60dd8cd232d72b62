"""PeerConfig's derived settings: what a peer sets up from the options it was given."""

from __future__ import annotations

from pathlib import Path

from peer.config import GPU_PEER_THREADS, PeerConfig
from swarm.types import LayerRange


def config(**options) -> PeerConfig:
    return PeerConfig(Path("model"), LayerRange(0, 2), "model", **options)


def test_a_gpu_peer_takes_few_cpu_threads_and_a_cpu_peer_keeps_torchs_default() -> None:
    # One thread per core in each of two processes on one machine slowed a GPU peer to a quarter of its
    # speed beside a streaming standby (docs/performance.md); a CPU peer computes with its threads.
    assert config(device="cuda").cpu_threads == config(device="cuda:1").cpu_threads == GPU_PEER_THREADS
    assert config(device="cpu").cpu_threads == 0  # 0: torch's default is left alone
    assert config(device="cuda", num_threads=12).cpu_threads == config(device="cpu", num_threads=12).cpu_threads == 12
