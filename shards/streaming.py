"""LayerStreamer: a shard's layer weights kept in (pinned) host memory and copied to the device a
layer at a time, at every forward pass.

Why: a standby (`swarm-peer serve --standby --stream-weights`) runs on its host's GPU beside that
host's own peer, which holds the GPU's memory; the standby's layers live in host memory. Streamed
through the GPU a layer's step takes the PCIe copy of its weights, about constant in the batch
(benchmarks/bench_streamed_standby.py: 16-20 ms for an int8 70B layer at 1-256 sequences a step on
an H200, 32-33 ms in bf16), so the sessions a standby carries while it is some layer's only server
go on at that speed (docs/performance.md; what it is worth to the swarm: docs/balancing.md).

How: two device slots, each a set of tensors shaped like one layer's parameters and buffers.
`stream(indices)` yields each layer's slot once its copy is in, and has started the next layer's
copy into the other slot on a copy stream, so that copy overlaps this layer's compute; a slot is
refilled only after the compute that read it. The caller runs the block with the slot's tensors in
place of its own (`torch.func.functional_call`). Every layer must have the same tensor shapes
(true of the families whose layers are alike; the others are refused when the layer is added).
On a CPU device (tests) the copies are plain, synchronous: same numbers, nothing gained.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn

Signature = tuple[tuple[str, tuple[int, ...], torch.dtype], ...]


def _signature(tensors: dict[str, torch.Tensor]) -> Signature:
    return tuple((name, tuple(t.shape), t.dtype) for name, t in sorted(tensors.items()))


class LayerStreamer:
    """Host-resident layer weights, streamed into two device slots; see the module docstring."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.host: dict[int, dict[str, torch.Tensor]] = {}  # layer index -> its tensors (pinned on CUDA)
        self.signature: Signature | None = None
        self.slots: list[dict[str, torch.Tensor]] = []
        cuda = device.type == "cuda"
        self.copy_stream = torch.cuda.Stream(device) if cuda else None
        # Per slot: its copy is in (the compute waits on it) / its last reader is done (a copy waits on it).
        self.copied = [torch.cuda.Event() for _ in range(2)] if cuda else []
        self.read = [torch.cuda.Event() for _ in range(2)] if cuda else []

    def add(self, index: int, block: nn.Module) -> None:
        """Take loaded layer `index`'s weights (its block's parameters and buffers, on the CPU) into
        streaming: pinned in place on CUDA, so the block holds no second copy."""
        tensors = _tensors(block)
        if any(t.device.type != "cpu" for t in tensors.values()):
            raise ValueError(f"layer {index}'s weights must be in host memory to be streamed")
        signature = _signature(tensors)
        if self.signature is None:
            self.signature = signature
            self.slots = [{name: torch.empty(shape, dtype=dtype, device=self.device) for name, shape, dtype in signature}
                          for _ in range(2)]
        elif signature != self.signature:
            raise ValueError(f"layer {index}'s tensors differ in shape from the first streamed layer's: "
                             "this model's layers cannot share streaming slots (serve it without --stream-weights)")
        if self.copy_stream is not None:
            _pin_in_place(block)
            tensors = _tensors(block)
        self.host[index] = tensors

    @property
    def slot_bytes(self) -> int:
        """Device bytes of the two slots."""
        return sum(t.numel() * t.element_size() for slot in self.slots for t in slot.values())

    def stream(self, indices: Iterable[int]) -> Iterator[tuple[int, dict[str, torch.Tensor]]]:
        """Yield (index, its weights on the device) for each layer in order. Enqueue the layer's
        compute before asking for the next: that is when the slot is marked read."""
        order = list(indices)
        missing = [i for i in order if i not in self.host]
        if missing:
            raise ValueError(f"layers {missing} are not loaded for streaming")
        if not order:
            return
        self._copy(order[0], 0)
        for n, index in enumerate(order):
            slot = n % 2
            if n + 1 < len(order):
                self._copy(order[n + 1], 1 - slot)
            if self.copy_stream is not None:
                torch.cuda.current_stream(self.device).wait_event(self.copied[slot])
            yield index, self.slots[slot]
            if self.copy_stream is not None:
                self.read[slot].record(torch.cuda.current_stream(self.device))

    def _copy(self, index: int, slot: int) -> None:
        """Start copying layer `index` into `slot` once the slot's last reader is done."""
        target, source = self.slots[slot], self.host[index]
        if self.copy_stream is None:
            for name, t in source.items():
                target[name].copy_(t)
            return
        with torch.cuda.stream(self.copy_stream):
            self.copy_stream.wait_event(self.read[slot])  # an event never recorded: no wait
            for name, t in source.items():
                target[name].copy_(t, non_blocking=True)
            self.copied[slot].record(self.copy_stream)


def _tensors(block: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of `block` by its name there (what functional_call replaces)."""
    named = [*block.named_parameters(), *block.named_buffers()]
    return {name: t.detach() for name, t in named}


def _pin_in_place(block: nn.Module) -> None:
    """Move every parameter and buffer of `block` to pinned host memory (the unpinned copy is freed)."""
    for module in block.modules():
        for param in module.parameters(recurse=False):
            param.data = param.data.pin_memory()
        for name, buf in module.named_buffers(recurse=False):
            if buf is not None:
                setattr(module, name, buf.pin_memory())
