"""Reading a load's next layer from disk while the current one goes to the GPU (Shard.from_pretrained).

safetensors maps a file and hands out views of it: the bytes come off the disk only when a tensor is
first read, which for a GPU peer is the host-to-device copy, one page fault after another on the loading
thread (0.97 s for a 1.71-GB Llama-2-70B layer from a cold disk on an H100 lease; docs/performance.md).
A move refills a departed peer's range one layer after another, and the swarm's flow through that range
waits for the last one (docs/balancing.md, thirty-sixth session), so here:
  * several threads copy each tensor into host memory in chunks, so the disk sees several reads at once
    (onto a GPU: into pinned memory, which the GPU then copies from at full PCIe speed);
  * the next layer is read while the loading thread copies the current one to the device and builds
    its block (and a growing move captures its graphs): the disk never waits for the GPU.
At most two layers sit in host memory: the one being installed and the one being read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch

# Chunks of one tensor read at once. A single stream of page faults leaves an NVMe disk idle between
# reads; a few in flight let it run at its rate (more adds nothing once the disk is the limit).
READ_THREADS = 4
# Bytes per chunk: large enough that each read is a long sequential one, small enough that a 470-MB
# MLP matrix splits across every thread.
CHUNK_BYTES = 32 << 20


def host_copy(tensor: torch.Tensor, pool: ThreadPoolExecutor, pin: bool = False) -> torch.Tensor:
    """A copy of `tensor` (a view of a mapped file) in host memory, read in parallel chunks; `pin`: in
    page-locked memory, which the GPU copies from at full PCIe speed (about 3x a pageable copy)."""
    source = tensor.contiguous().reshape(-1)
    out = torch.empty_like(source, pin_memory=pin)
    step = max(1, CHUNK_BYTES // max(1, source.element_size()))
    # Tensor.copy_ releases the GIL: the chunks' page faults run on the pool's threads at once.
    chunks = [
        pool.submit(out[i : i + step].copy_, source[i : i + step]) for i in range(0, source.numel(), step)
    ]
    for chunk in chunks:
        chunk.result()
    return out.view(tensor.shape)


def release_pinned_cache() -> None:
    """Free the pinned buffers torch's host allocator keeps for reuse: torch.accelerator.empty_host_cache
    in newer torch, the same call under its private name in older ones (a GPU machine's image)."""
    empty = getattr(torch.accelerator, "empty_host_cache", None) or getattr(torch._C, "_host_emptyCache", None)
    if empty is not None:
        empty()


class LayerReadAhead:
    """Yields (layer, tensors in host memory) in `order`, reading each next layer while the caller uses
    the one before. `read(layer)` returns the layer's tensors as views of the mapped files
    (shards.loading.load_tensors onto the CPU); `pin`: copy them into pinned memory (for a GPU). Use as a
    context manager: leaving it early (a failed
    or cancelled load) cancels the read not started and waits for the one running."""

    def __init__(self, order: Sequence[int], read: Callable[[int], dict[str, torch.Tensor]], pin: bool = False) -> None:
        self.order, self.read, self.pin = list(order), read, pin
        self._chunks = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="layer-read")
        self._layers = ThreadPoolExecutor(1, thread_name_prefix="layer-read-ahead")

    def __enter__(self) -> LayerReadAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self._layers.shutdown(wait=True, cancel_futures=True)
        self._chunks.shutdown(wait=True, cancel_futures=True)
        if self.pin:  # torch keeps freed pinned buffers for reuse: give the load's (two layers) back
            release_pinned_cache()

    def _read_to_host(self, layer: int) -> dict[str, torch.Tensor]:
        return {name: host_copy(t, self._chunks, self.pin) for name, t in self.read(layer).items()}

    def __iter__(self) -> Iterator[tuple[int, dict[str, torch.Tensor]]]:
        if not self.order:
            return
        pending: Future[dict[str, torch.Tensor]] = self._layers.submit(self._read_to_host, self.order[0])
        for i, layer in enumerate(self.order):
            tensors = pending.result()
            if i + 1 < len(self.order):  # read the next one while the caller installs this one
                pending = self._layers.submit(self._read_to_host, self.order[i + 1])
            yield layer, tensors
            del tensors  # the caller has it on the device now: free its host copy before the next read
